//! The logical wake-up mode on throwaway clusters with `wal_level = logical`.

mod wal_stream;
