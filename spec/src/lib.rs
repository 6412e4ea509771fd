//! placeholder until the spec helper writes it
