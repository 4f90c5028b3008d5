//! # combd-kernel
//!
//! The deterministic bottom layer of combd. Nothing here runs an event loop, spawns a thread
//! or keeps state between calls; `combd-shards` and the `combd` binary build on it, and it
//! depends on neither.
//!
//! ## The modules
//!
//! - [`limits`] declares every fixed bound of the node once, with the reason for its value and
//!   what it costs in memory, and checks at compile time the relations between them that must
//!   hold. It also holds the default of every setting, and computes the one limit derived at
//!   start-up ([`limits::outbound_budget_per_shard`]). No other crate passes a bare number to a
//!   constructor.
//! - [`settings`] is the one place where the `COMBD_*` environment variables and their matching
//!   command-line flags are declared, parsed and validated. A value that does not parse, or is
//!   zero where zero would mean "unlimited", fails start-up with a [`settings::ConfigError`]
//!   naming the setting.
//! - [`memory`] finds the memory budget (`COMBD_MEMORY_BUDGET`, else the memory cgroup's limit,
//!   v2 or v1, else the machine's RAM) and parses what the node measures against it: the
//!   cgroup's usage, `/proc/meminfo`, its own RSS and the kernel's TCP memory.
//! - [`sys`] is what combd asks the Linux kernel: the CPUs it may run on, its file-descriptor
//!   limit, listener sockets (`SO_REUSEPORT`, the listen backlog, stop and resume listening),
//!   TCP keepalive, and the data disk's free space.
//! - [`uring`] asks once, before the shards start, whether io_uring serves this process with
//!   every opcode the shards need, and says why not in one line (seccomp, the sysctl, an old
//!   kernel).
//! - [`fair`] says who is asking ([`fair::ClientKey`]: an address, an IPv6 prefix, the node's
//!   own machine) and how much of a shared pool one client may hold ([`fair::Shares`]).
//! - [`admission`] makes the decisions: the memory pressure level, whether the node is full
//!   and why, the hold that keeps that state from flapping, and whether the disk is low.
//!
//! ## From a measurement to a refusal
//!
//! Once a second, and every [`limits::MEASURE_EVERY_ACCEPTS`] accepted connections, the
//! coordinator thread of the `combd` crate takes a measurement: [`memory::MemoryProbe`] reads
//! the cgroup and `/proc` files and hands their text to the [`memory`] parsers, and
//! [`sys::disk_space`] asks `statvfs` about the data disk. The plain numbers go to [`admission`]:
//! [`admission::pressure`] turns memory into a level, [`admission::full_reasons`] adds the
//! connection cap and the shards' lag, and [`admission::AdmissionState`] keeps each state for
//! [`limits::STATE_HOLD`]. The coordinator publishes the result in `combd-shards`' shared
//! atomics and wakes the shards, which stop listening on their public sockets while the node is
//! full: the refusal happens at TCP, and the thresholds behind it are all in [`limits`].
//!
//! ## Where a setting lives
//!
//! A setting's default is a constant in [`limits`] (e.g. [`limits::MAX_CONNS_DEFAULT`]); its
//! field, variable, flag, parser, unit, `/stats` name and help text are one row of the settings
//! table in [`settings`], from which the [`settings::Settings`] struct, its loading, `--help`,
//! `--check-config` and the settings' limits in `/stats` are written; its unit tests check every
//! default `--help` writes against the value the node uses. A bound nobody should move without a code change
//! (a head's size, a mailbox's length) is only a constant in [`limits`].
//!
//! Parsers take `&str` and decisions take values, so everything here is unit-tested on fixture
//! text; the file read or system call around a parser is one line. The system calls go through
//! `nix` and `socket2`; the one exception is [`uring`], whose two io_uring system calls `nix`
//! does not wrap: it alone may use `unsafe`, each block with its invariant.

#![deny(unsafe_code)]

pub mod admission;
pub mod fair;
pub mod limits;
pub mod memory;
pub mod origins;
pub mod settings;
pub mod sys;
#[allow(unsafe_code)]
pub mod uring;
