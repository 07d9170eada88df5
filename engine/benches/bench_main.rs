//! Engine benchmarks (criterion): the per-node overhead of the executor on a 1000-node chain, cold and fully
//! cached.

// criterion's macros define undocumented functions.
#![allow(missing_docs)]

mod chain;

criterion::criterion_main!(chain::benches);
