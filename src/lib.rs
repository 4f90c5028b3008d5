//! # combd
//!
//! The node's binary (`src/main.rs`) and what it is built from here: the built-in apps
//! ([`apps`]) and the entry points the fuzz targets and their corpus tests share
//! ([`fuzz`]). The serving machinery lives in `combd-shards`, the settings, limits and
//! kernel parsers in `combd-kernel`.

pub mod apps;
pub mod fuzz;
