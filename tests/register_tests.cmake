# Registers a gtest binary's cases with CTest (run after the binary is linked; tests/CMakeLists.txt,
# tessera_test): one CTest entry per gtest suite, which runs that suite's cases in one process, or
# one entry per case with EACH_CASE (the GPU suites, each case reported skipped on its own).
# Starting a test process costs about 0.3 s of CPU here (libtorch's static initialisation), more
# than most unit cases take, so an entry per case spent a fifth of `make test` starting processes.
#
# Reads CONFIG, a file written at configure time that sets: EXE (the binary), FILTER (a gtest
# filter: only matching cases are registered), EACH_CASE, PROPERTIES (CTest properties of every entry),
# WORKING_DIRECTORY and OUT, the file this writes; CTest includes OUT (TEST_INCLUDE_FILES).
# An entry's filter lists its cases by name, so it runs exactly what was registered. A binary that
# cannot list its cases fails its build, naming the binary and what it printed.
include(${CONFIG})
execute_process(COMMAND ${EXE} --gtest_list_tests "--gtest_filter=${FILTER}"
  WORKING_DIRECTORY ${WORKING_DIRECTORY} OUTPUT_VARIABLE listing ERROR_VARIABLE listing_err
  RESULT_VARIABLE listed TIMEOUT 60)
if(NOT listed EQUAL 0)
  message(FATAL_ERROR "${EXE} --gtest_list_tests failed (${listed}):\n${listing}${listing_err}")
endif()

# The listing: "Suite." lines, each followed by "  Case" lines; either may end in a comment
# ("  # GetParam() = ...") that is not part of the name.
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(suites "")
foreach(line IN LISTS lines)
  string(REGEX REPLACE " *#.*$" "" line "${line}")
  if(line MATCHES "^([^ ].*)\\.$")
    set(suite "${CMAKE_MATCH_1}")
    list(APPEND suites "${suite}")
    set("cases_${suite}" "")
  elseif(line MATCHES "^  ([^ ]+)$")
    list(APPEND "cases_${suite}" "${suite}.${CMAKE_MATCH_1}")
  endif()
endforeach()

set(script "")
# COST, the number of cases, orders the entries of a run without CTest's cost data (a fresh clone):
# the large suites start first instead of ending the run alone.
macro(add_entry name filter cost)
  string(APPEND script "add_test([==[${name}]==] [==[${EXE}]==] [==[--gtest_filter=${filter}]==])\n"
    "set_tests_properties([==[${name}]==] PROPERTIES WORKING_DIRECTORY [==[${WORKING_DIRECTORY}]==] COST ${cost} ${PROPERTIES})\n")
endmacro()
foreach(suite IN LISTS suites)
  set(cases ${cases_${suite}})
  if(NOT cases)
    continue()
  endif()
  if(EACH_CASE)
    foreach(case IN LISTS cases)
      add_entry("${case}" "${case}" 1)
    endforeach()
  else()
    list(LENGTH cases count)
    list(JOIN cases ":" filter)
    add_entry("${suite}" "${filter}" ${count})
  endif()
endforeach()
file(WRITE ${OUT} "${script}")
