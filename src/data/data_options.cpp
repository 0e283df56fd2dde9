// Checks of the [data] section. Only the values themselves are checked here: whether the files
// exist is checked when they are opened (TokenFile::open names the file).
#include "data/data_options.h"

#include "core/error.h"

namespace tessera {

void DataOptions::check(const std::string& source) const {
  check_ranges(*this, "data", source);
  require(!path.empty(), source, ": data.path must not be empty");
  require(!train_file.empty(), source, ": data.train_file must not be empty");
  require(!val_file.empty(), source, ": data.val_file must not be empty");
  require(train_file != val_file, source, ": data.train_file and data.val_file must differ (both '", train_file,
          "')");
}

}  // namespace tessera
