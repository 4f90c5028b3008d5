//! The macro that turns the settings table (`table.rs`) into the [`Settings`] struct, the
//! [`SETTINGS`] list and the loading of every setting, so that a setting is declared once.
//!
//! The table has two parts:
//!
//! - `fields`: a setting that is one field of [`Settings`]. Each row names the field and its
//!   type, the variable and the flag, the default, the parser, the unit, the `/stats` limit
//!   (`none` for a setting that is not a number), optionally how `--check-config` prints it
//!   (else [`Show`]), and its meaning. The default is one of
//!   - `default: <value>`: used as is when the setting is not given (a [`limits`] constant);
//!   - `text: <text>`: parsed by the parser when the setting is not given;
//!   - `computed: "<how, in words>"`: the parser is then a resolver, `fn(Option<&str>,
//!     &Context) -> Result<T, String>`, given the text if any.
//! - `groups`: settings that only mean something together (TLS's listener and files, the
//!   fleet's), one field of [`Settings`] per group, built by a function from every given text;
//!   each member row says how its value is printed and, for a number, read for `/stats`.
//!
//! A parser's error becomes a [`ConfigError`] naming the setting's variable.
//!
//! [`Settings`]' methods are written here too, so they are in the module that defines it (the
//! table's): [`Settings::load`] (reading the texts given and checking the settings against each
//! other are functions of the settings' module, `mod.rs`), its clients' shares, its
//! description for `--check-config`, its limits for `/stats`, and its connection cap in force.

/// Writes [`Settings`], [`SETTINGS`] and `Settings::from_given` from the table, and
/// [`Settings`]' methods; see the module's documentation for the rows' form.
macro_rules! settings_table {
    (
        fields {
            $(
                $(#[$doc:meta])*
                $field:ident: $ty:ty {
                    env: $env:literal,
                    flag: $flag:literal,
                    $kind:ident: $default:expr,
                    parse: $parse:expr,
                    unit: $unit:ident,
                    limit: $limit:tt $(= $limit_value:expr)?,
                    $(show: $show:expr,)?
                    meaning: $meaning:expr $(,)?
                }
            )*
        }
        groups {
            $(
                $(#[$group_doc:meta])*
                $group:ident: $group_ty:ty = $build:path {
                    $({
                        env: $member_env:literal,
                        flag: $member_flag:literal,
                        default: $member_default:expr,
                        unit: $member_unit:ident,
                        limit: $member_limit:tt $(= $member_limit_value:expr)?,
                        value: $member_value:expr,
                        meaning: $member_meaning:expr $(,)?
                    })*
                }
            )*
        }
    ) => {
        /// The validated settings of a node: one field per setting of the table (`table.rs`),
        /// and one per group of settings that only mean something together.
        #[derive(Debug, Clone)]
        pub struct Settings {
            $( $(#[$doc])* pub $field: $ty, )*
            $( $(#[$group_doc])* pub $group: $group_ty, )*
            /// Where each setting came from, by environment variable name.
            pub sources: BTreeMap<&'static str, Source>,
        }

        /// Every setting of the node, in the table's order. `--help`, `--check-config`,
        /// `/stats` and README.md list exactly these.
        pub const SETTINGS: &[SettingSpec] = &[
            $(SettingSpec {
                env: $env,
                flag: $flag,
                default: settings_table!(@default $kind $default, $unit),
                unit: Unit::$unit,
                limit: settings_table!(@limit $field $limit $(= $limit_value)?),
                meaning: $meaning,
                value: |s: &Settings| settings_table!(@show s.$field $(, $show)?),
            },)*
            $($(SettingSpec {
                env: $member_env,
                flag: $member_flag,
                default: $member_default,
                unit: Unit::$member_unit,
                limit: settings_table!(@member_limit $member_limit $(= $member_limit_value)?),
                meaning: $member_meaning,
                value: $member_value,
            },)*)*
        ];

        impl Settings {
            /// Parses every setting from the texts given, in the table's order; the first
            /// that fails is the error, naming it.
            pub(super) fn from_given(
                given: &Given<'_>,
                cx: &Context,
                sources: BTreeMap<&'static str, Source>,
            ) -> Result<Settings, ConfigError> {
                Ok(Settings {
                    $($field: settings_table!(@load $kind $default, $parse, given.get($env), cx)
                        .map_err(|m| err($env, m))?,)*
                    $($group: $build(given)?,)*
                    sources,
                })
            }

            /// Every client's share of the node's shared pools (`COMBD_CLIENT_SHARE_MIN_PERCENT`,
            /// `COMBD_CLIENT_SHARE_MAX_PERCENT`).
            pub fn shares(&self) -> crate::fair::Shares {
                crate::fair::Shares {
                    min_percent: self.client_share_min_percent,
                    max_percent: self.client_share_max_percent,
                }
            }

            /// Reads the settings from an environment lookup and the command-line arguments
            /// (without the program name), validating every one. `allowed_cpus` is how many CPUs
            /// this process may run on: the default and the upper bound of `COMBD_SHARDS`.
            pub fn load(
                env: impl Fn(&str) -> Option<String>,
                args: &[String],
                allowed_cpus: usize,
            ) -> Result<(Command, Settings), ConfigError> {
                let (command, raw) = read_given(env, args)?;
                let given = Given { raw: &raw };
                let context = Context { allowed_cpus };
                let settings = Settings::from_given(&given, &context, sources_of(&raw))?;
                check_relations(&settings)?;
                Ok((command, settings))
            }

            /// Every setting's effective value as text, with where it came from, in table order.
            pub fn describe(&self) -> Vec<(&'static str, String, Source)> {
                SETTINGS
                    .iter()
                    .map(|spec| {
                        let source = self
                            .sources
                            .get(spec.env)
                            .copied()
                            .unwrap_or(Source::Default);
                        (spec.env, (spec.value)(self), source)
                    })
                    .collect()
            }

            /// Every setting that is a number, under its `/stats` name with its value in force,
            /// then the limits derived from a setting ([`DERIVED_LIMITS`]), in table order.
            pub fn limits(&self, in_force: &InForce) -> Vec<(&'static str, u64)> {
                SETTINGS
                    .iter()
                    .filter_map(|spec| spec.limit)
                    .chain(DERIVED_LIMITS.iter().copied())
                    .map(|l| (l.name, (l.value)(self, in_force)))
                    .collect()
            }

            /// The public connection cap in force: `COMBD_MAX_CONNS`, clamped to the
            /// file-descriptor limit less [`limits::FD_RESERVE`], the localhost listener's own cap
            /// ([`limits::LOCAL_CONNS_MAX`]) and the live objects' descriptors
            /// (`COMBD_MAX_OPEN_OBJECTS` × [`limits::OBJECT_FDS`]); in a fleet the fleet listener
            /// has a cap of its own as large as the public one, so the descriptors left are split
            /// between the two.
            pub fn max_conns_effective(&self, nofile_soft: u64) -> u64 {
                let objects = self.max_open_objects.saturating_mul(limits::OBJECT_FDS);
                let fds = nofile_soft
                    .saturating_sub(limits::FD_RESERVE + limits::LOCAL_CONNS_MAX)
                    .saturating_sub(objects);
                let fds = if self.fleet.is_some() { fds / 2 } else { fds };
                self.max_conns.min(fds).max(1)
            }
        }
    };

    (@default default $value:expr, $unit:ident) => {
        DefaultValue::Value(|| Unit::$unit.human(AsLimit::as_limit(&$value)))
    };
    (@default text $text:expr, $unit:ident) => {
        DefaultValue::Value(|| $text.to_string())
    };
    (@default computed $how:expr, $unit:ident) => {
        DefaultValue::Described($how)
    };

    (@load default $value:expr, $parse:expr, $given:expr, $cx:expr) => {
        match $given {
            Some(text) => ($parse)(text),
            None => Ok($value),
        }
    };
    (@load text $text:expr, $parse:expr, $given:expr, $cx:expr) => {
        ($parse)($given.unwrap_or($text))
    };
    (@load computed $how:expr, $resolve:expr, $given:expr, $cx:expr) => {
        ($resolve)($given, $cx)
    };

    (@limit $field:ident none) => {
        None
    };
    (@limit $field:ident $name:literal) => {
        Some(Limit {
            name: $name,
            value: |s: &Settings, _: &InForce| AsLimit::as_limit(&s.$field),
        })
    };
    (@limit $field:ident $name:literal = $value:expr) => {
        Some(Limit {
            name: $name,
            value: $value,
        })
    };
    (@member_limit none) => {
        None
    };
    (@member_limit $name:literal = $value:expr) => {
        Some(Limit {
            name: $name,
            value: $value,
        })
    };

    (@show $value:expr) => {
        Show::show(&$value)
    };
    (@show $value:expr, $show:expr) => {
        ($show)(&$value)
    };
}
