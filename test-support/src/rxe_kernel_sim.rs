//! (moved here from its test file)
