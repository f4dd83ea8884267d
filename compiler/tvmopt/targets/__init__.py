"""Hardware targets: the registry read from targets/*.toml, the CUDA toolchain and cross compilers."""
