"""Edge bundles: a compiled model, the TVM runtime libraries and a C++ runner in one tarball that
runs on a Linux board without Python (aarch64 cross-built here, or x86_64)."""
