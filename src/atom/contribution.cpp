// ContributionProgress (contribution.h): the final ranges as an interval set.
#include "atom/contribution.h"

#include <algorithm>
#include <iterator>

#include "core/error.h"

namespace tessera::atom {

void ContributionProgress::mark_final(int64_t begin, int64_t end) {
  require(0 <= begin && begin <= end && end <= numel_, "internal: range [", begin, ", ", end,
          ") of a contribution of ", numel_, " entries");
  if (begin < end) {
    std::lock_guard<std::mutex> lock(mutex_);
    // Merge with every range that overlaps or touches [begin, end).
    auto it = final_.upper_bound(begin);
    if (it != final_.begin() && std::prev(it)->second >= begin) --it;
    while (it != final_.end() && it->first <= end) {
      begin = std::min(begin, it->first);
      end = std::max(end, it->second);
      it = final_.erase(it);
    }
    final_[begin] = end;
  }
  changed();
}

void ContributionProgress::withdraw(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (withdrawn_.empty()) withdrawn_ = why.empty() ? "withdrawn" : why;
  }
  changed();
}

bool ContributionProgress::final(int64_t begin, int64_t end) const {
  if (begin >= end) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = final_.upper_bound(begin);
  if (it == final_.begin()) return false;
  --it;
  return it->first <= begin && it->second >= end;
}

std::string ContributionProgress::withdrawn() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return withdrawn_;
}

void ContributionProgress::on_change(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(mutex_);
  listener_ = std::move(listener);
}

void ContributionProgress::changed() {
  std::function<void()> listener;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    listener = listener_;
  }
  if (listener) listener();
}

}  // namespace tessera::atom
