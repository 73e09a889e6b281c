//! Typed results, one per command.
