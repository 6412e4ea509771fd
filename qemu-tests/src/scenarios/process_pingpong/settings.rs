//! The settings of a process-pingpong run.

/// Settings of a run (kept small under TCG; the same code runs bigger on real hosts).
#[derive(Debug, Clone)]
pub struct Settings {
    pub small_iters: u32,
    pub large_iters: u32,
    pub cleanup_rounds: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            small_iters: 200,
            large_iters: 20,
            cleanup_rounds: 50,
        }
    }
}
