//! # combd-kernel
//!
//! The deterministic bottom layer of combd. Nothing here runs an event loop.
//!
//! - [`limits`] declares every fixed bound of the node once, with the reason for its value and
//!   what it costs in memory. No other crate passes a bare number to a constructor.
//! - [`settings`] is the one place where the `COMBD_*` environment variables and their matching
//!   command-line flags are declared, parsed and validated. A value that does not parse, or is
//!   zero where zero would mean "unlimited", fails start-up with a [`settings::ConfigError`]
//!   naming the setting.
//! - [`sys`] is what combd asks the Linux kernel: the CPUs it may run on, its file-descriptor
//!   limit, and listener sockets (`SO_REUSEPORT`, the listen backlog).
//!
//! Parsers take `&str` and decisions take values, so everything here is unit-tested on fixture
//! text; the file read or system call around a parser is one line.

pub mod admission;
pub mod limits;
pub mod memory;
pub mod settings;
pub mod sys;
