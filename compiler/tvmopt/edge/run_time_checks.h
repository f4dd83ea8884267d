// The handler of tvmopt's run-time checks (frontend/run_time_checks.py): a check kernel compiled
// into model.so calls the packed function "tvmopt.run_time_check_failed" when an index or size
// read from the inputs is out of range, before any kernel uses it. Registering it here turns that
// call into an error of the one call (an ffi::Error of kind InputValueError), in the words
// run_time_checks.message() uses; without it the call fails on the missing function instead.
#pragma once

#include <cstdint>
#include <string>

#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

namespace tvmopt_checks {

inline std::string Message(const std::string& kind, const std::string& where, int64_t value,
                           int64_t low, int64_t high, int64_t position, int64_t count) {
  std::string v = std::to_string(value), p = std::to_string(position);
  if (kind == "index") {
    std::string at = count > 1 ? " (coordinate " + std::to_string(position % count) + " of an index tuple)" : "";
    return where + ": index " + v + " is out of range: valid indices are [" + std::to_string(low) + ", " +
           std::to_string(high) + "]" + at;
  }
  if (kind == "size") {  // high < low: no upper bound but the element limit
    std::string valid = high >= low ? std::to_string(low) + ".." + std::to_string(high)
                                    : "at least " + std::to_string(low);
    return where + ": value " + v + " at position " + p + " is out of range (" + valid + ")";
  }
  if (kind == "nonzero") return where + ": value " + v + " at position " + p + " must not be 0";
  if (kind == "broadcast") {
    return where + ": value " + v + " at position " + p + " cannot broadcast with the input's dim " +
           std::to_string(low) + " (it must be 1, or equal it, or the dim must be 1)";
  }
  if (kind == "reshape") {
    return where + ": the shape holds " + v + " elements, the input " + std::to_string(low) +
           ": they must be equal";
  }
  if (kind == "equal") {
    return where + ": value " + v + " at position " + p + " must be " + std::to_string(low);
  }
  if (kind == "split") {
    return where + ": the parts add up to " + v + ", the axis is " + std::to_string(low) +
           " long: they must be equal";
  }
  if (kind == "elements") {
    std::string at = count > 1 ? "value " + v + " at position " + p : "value " + v;
    return where + ": " + at + " asks for a tensor of more than " + std::to_string(high) +
           " elements, the limit this artifact was compiled with (compile --max-elements)";
  }
  return where + ": value " + v + " is out of range [" + std::to_string(low) + ", " + std::to_string(high) + "]";
}

inline void Register() {
  tvm::ffi::Function::SetGlobal(
      "tvmopt.run_time_check_failed",
      tvm::ffi::Function::FromTyped([](std::string kind, std::string where, int64_t value, int64_t low,
                                       int64_t high, int64_t position, int64_t count) {
        TVM_FFI_THROW(InputValueError) << Message(kind, where, value, low, high, position, count);
      }),
      true);
}

}  // namespace tvmopt_checks
