//! The generated code end to end: a server built from the generated router with an in-test implementation
//! of `Api` (`fixture.rs`), driven by the generated client over real HTTP on 127.0.0.1, for every operation.

mod counts;
mod fixture;
mod mounting;
mod round_trip;
mod snapshots;
