//! The logical wake-up mode on throwaway clusters with `wal_level = logical`.

mod standby;
mod wal_stream;
