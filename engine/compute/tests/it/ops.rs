//! Each op on the CPU backend against a plain reference implementation.
