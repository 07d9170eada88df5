//! Each op on the CUDA backend against the CPU backend, with tolerances; skips with a message without a GPU.
