//! How a command tells its callers which failure it met: the service's command line (`cli.rs`)
//! and the dev tools' (`dev/cli.rs`) both fail with it, and `main` exits with its code.

/// A failure with an exit code of its own, for a command whose callers must tell its failures
/// apart (`idempay pay`: refused, or its outcome unknown). `main` exits with `code`; any other
/// error exits 1.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Exit {
    pub code: u8,
    pub message: String,
}

/// The exit code of a command refused for its settings, as clap exits for a value it cannot read:
/// a usage error, whether one setting is wrong or two contradict each other.
pub const USAGE: u8 = 2;

/// A refusal of the settings, `message` naming each setting and its value: exits [`USAGE`].
pub fn refused_settings(message: String) -> anyhow::Error {
    Exit {
        code: USAGE,
        message,
    }
    .into()
}
