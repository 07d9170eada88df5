//! The server's integration tests: the router in memory, and the real `kiln` binary over TCP.

mod binary;
mod system_stats;
