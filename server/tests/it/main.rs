//! The server's integration tests: the router in memory, and the real `kiln` binary over TCP.

mod announce;
mod bad_input;
mod binary;
mod durability;
mod end_to_end;
mod frontend;
mod golden;
mod numbers;
mod system_stats;
