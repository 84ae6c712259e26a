//! One module per API the gateway heals. A dialect parses its wire request, names the run,
//! renders the healed answer back in its own shape (whole or streamed); the protocol-neutral
//! parts of a turn live in [`crate::pipeline`], shared by every dialect.

pub(crate) mod chat;
pub(crate) mod messages;
pub(crate) mod responses;
