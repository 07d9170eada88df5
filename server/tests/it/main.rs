//! The server's integration tests: the router in memory, and the real `kiln` binary over TCP.

mod bad_input;
mod binary;
mod durability;
mod end_to_end;
mod frontend;
mod golden;
mod key_order;
mod models;
mod system_stats;
