//! The container files and the command line, checked without a container engine.

mod container_and_cli;
