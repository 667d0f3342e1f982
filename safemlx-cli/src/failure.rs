//! How a command fails: a setting that cannot work (exit 2, as clap's own
//! refusals of a flag) or a failure while it runs (exit 1).

/// A command's failure and its exit status.
#[derive(Debug)]
pub enum Failure {
    /// A flag, a layout or an environment setting that cannot work for
    /// this run (`--mesh pp=3` on 2 ranks): exit 2, nothing computed.
    Usage(String),
    /// Anything else: a file, the model, a peer.
    Run(String),
}

impl Failure {
    pub fn message(&self) -> &str {
        match self {
            Self::Usage(m) | Self::Run(m) => m,
        }
    }

    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => 2,
            Self::Run(_) => 1,
        }
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Self::Run(message)
    }
}

impl From<safemlx_dist::Error> for Failure {
    /// A setting's error ([`safemlx_dist::Error::Setting`]) is a usage
    /// error; the rest happen while the command runs.
    fn from(error: safemlx_dist::Error) -> Self {
        match error {
            safemlx_dist::Error::Setting(_) => Self::Usage(error.to_string()),
            other => Self::Run(other.to_string()),
        }
    }
}
