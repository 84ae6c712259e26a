//! # selfheal-gateway — an OpenAI-compatible proxy that heals any agent
//!
//! Being built (issue 6).
