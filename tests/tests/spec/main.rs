//! The spec's protection: its operation inventory and schema shapes as insta snapshots, Spectral's result on it,
//! a fixture per custom Spectral rule, and the TypeScript types generated from it.

mod golden;
mod inventory;
mod schemas;
mod spectral;
mod typescript;
