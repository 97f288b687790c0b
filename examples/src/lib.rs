//! Helpers shared by the examples (printing a readable timeline).
