//! Why the node stops with an error, and the exit status that says so.

use combd_kernel::settings::ConfigError;
use combd_shards::StartError;

/// Why the node stops with an error. The message is printed as `combd: <message>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// A setting's value is invalid or cannot be served; the message starts with the
    /// setting's name. Restarting will not help: exit 78.
    Config(String),
    /// Anything else (a shard failed, a file of the machine could not be read): exit 70.
    Software(String),
}

impl Failure {
    pub(crate) fn message(&self) -> &str {
        match self {
            Failure::Config(m) | Failure::Software(m) => m,
        }
    }
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Failure {
        Failure::Config(e.to_string())
    }
}

impl From<combd_shards::tls::TlsError> for Failure {
    /// A certificate or key that cannot be loaded names its setting.
    fn from(e: combd_shards::tls::TlsError) -> Failure {
        Failure::Config(e.to_string())
    }
}

impl From<StartError> for Failure {
    fn from(e: StartError) -> Failure {
        match e {
            StartError::Setting { .. } | StartError::Unsupported(_) => {
                Failure::Config(e.to_string())
            }
            StartError::Runtime(message) => Failure::Software(message),
        }
    }
}

/// The process's exit status for a failure: the only place that chooses one.
pub(crate) fn exit_status(f: &Failure) -> i32 {
    /// sysexits.h: configuration error. systemd's unit does not restart on it.
    const EX_CONFIG: i32 = 78;
    /// sysexits.h: internal software error.
    const EX_SOFTWARE: i32 = 70;
    match f {
        Failure::Config(_) => EX_CONFIG,
        Failure::Software(_) => EX_SOFTWARE,
    }
}

/// Prints `combd: <message>` to stderr and exits with the failure's status.
pub(crate) fn fail(f: Failure) -> ! {
    eprintln!("combd: {}", f.message());
    std::process::exit(exit_status(&f));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_exits_78_anything_else_70() {
        assert_eq!(exit_status(&Failure::Config("COMBD_LOG: bad".into())), 78);
        assert_eq!(exit_status(&Failure::Software("a shard failed".into())), 70);
        let e = ConfigError {
            setting: "COMBD_MAX_BODY".into(),
            message: "must not be zero".into(),
        };
        assert_eq!(
            Failure::from(e),
            Failure::Config("COMBD_MAX_BODY: must not be zero".into())
        );
    }

    #[test]
    fn start_errors_keep_their_message_and_pick_the_status() {
        let taken = Failure::from(StartError::Setting {
            setting: "COMBD_LISTEN",
            message: "0.0.0.0:8080 is in use".into(),
        });
        assert_eq!(taken.message(), "COMBD_LISTEN: 0.0.0.0:8080 is in use");
        assert_eq!(exit_status(&taken), 78);
        let shard = Failure::from(StartError::Runtime("shard 1 did not start".into()));
        assert_eq!(shard.message(), "shard 1 did not start");
        assert_eq!(exit_status(&shard), 70);
    }
}
