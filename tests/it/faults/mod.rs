//! Faults and bad input: the service keeps delivering through failures and names every malformed request.

mod bad_input;
mod scenarios;
