//! The server's integration tests: the router in memory, and the real `kiln` binary over TCP.

mod announce;
mod bad_input;
mod binary;
mod cloud;
mod cloud_isolation;
mod durability;
mod end_to_end;
mod execution_errors;
mod frontend;
mod golden;
mod key_order;
mod models;
mod numbers;
mod openapi;
mod settings;
mod slow_client;
mod spec_agreement;
mod system_stats;
mod zimage;
