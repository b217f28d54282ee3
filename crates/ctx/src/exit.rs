//! The exit status every command returns.

/// A command's exit status (0 success, 1 checked and found wanting, 2
/// error): a number the Python extension can hand back, unlike
/// `std::process::ExitCode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitCode(u8);

impl ExitCode {
    /// Exit 0.
    pub const SUCCESS: ExitCode = ExitCode(0);

    /// The status as a number.
    pub fn code(self) -> u8 {
        self.0
    }
}

impl From<u8> for ExitCode {
    fn from(code: u8) -> ExitCode {
        ExitCode(code)
    }
}
