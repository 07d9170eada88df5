//! The compute layer's integration tests, one binary: every op on the CPU against plain reference
//! implementations (`ops`), and on CUDA against the CPU when a GPU is present (`cuda`, which skips with a
//! message otherwise).

mod common;
mod cuda;
mod lora;
mod memory;
mod ops;
