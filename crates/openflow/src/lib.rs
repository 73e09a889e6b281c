//! A sans-IO codec of OpenFlow 1.3, 1.4 and 1.5 (wire versions 0x04 to 0x06) for the
//! switch side.
//!
//! * [`Framer`] splits a connection's byte stream into messages by the header's length,
//!   whatever the read splits, and refuses versions the connection did not negotiate.
//! * [`decode`] turns one message into a typed [`Message`], enforcing the specification
//!   (lengths, OXM prerequisites, action and instruction rules); a refusal is an
//!   [`OfError`] carrying the exact `OFPET_*` type and code, which
//!   [`OfError::encode_reply`] turns into the ERROR message (with the first 64 bytes of the
//!   request) the peer expects. [`encode`] writes a message; every value `decode` returns
//!   encodes back to a message that decodes to the same value.
//! * HELLO carries a version bitmap (1.0, 1.3, 1.4, 1.5 … may be offered and
//!   [`negotiate`]d); message bodies are 1.3's, 1.4's or 1.5's by the header's version
//!   ([`message`] lists where they differ), and [`encode_with_version`] writes each
//!   version's layout. Bundles ([`bundle`]) and the Nicira messages ovn-controller sends
//!   ([`nx_msg`]) are decoded too.
//! * A multipart reply longer than one message is split by [`encode_multipart_reply`].
//!
//! A connection's receive loop:
//!
//! ```
//! use ferrovs_openflow::{decode, encode, negotiate, FrameError, Framer, Message};
//!
//! let ours = [ferrovs_openflow::VERSION_1_3];
//! let mut framer = Framer::new();
//! let mut replies = Vec::new();
//! // What the peer wrote, in any split.
//! framer.push(&encode(&Message::Hello { versions: vec![1, 4] }, 1));
//! framer.push(&encode(&Message::BarrierRequest, 2));
//! framer.push(&[4, 99, 0, 8, 0, 0, 0, 3]); // an unknown type
//! loop {
//!     match framer.next_message() {
//!         Ok(Some(bytes)) => match decode(&bytes) {
//!             Ok((h, Message::Hello { versions })) => {
//!                 let v = negotiate(&ours, h.version, &versions).expect("a common version");
//!                 framer.set_version(v);
//!             }
//!             Ok((h, Message::BarrierRequest)) => {
//!                 replies.push(encode(&Message::BarrierReply, h.xid))
//!             }
//!             Ok(_) => {}
//!             // OFPBRC_BAD_TYPE, carrying the request's first 64 bytes.
//!             Err(e) => replies.push(e.encode_reply(&bytes)),
//!         },
//!         Ok(None) => break, // read more
//!         Err(e @ FrameError::BadVersion { .. }) => {
//!             let FrameError::BadVersion { message, .. } = &e else { unreachable!() };
//!             replies.push(e.of_error().encode_reply(message));
//!         }
//!         Err(FrameError::BadLength(_)) => break, // answer OFPBRC_BAD_LEN and close
//!     }
//! }
//! assert_eq!(replies.len(), 2);
//! ```
//!
//! No I/O, no allocation beyond the messages themselves, no panics on any input (a fuzz
//! target holds it to that). It depends on nothing else of ferrovs: the daemon maps these
//! types onto `ferrovs_flow`'s rules. `docs/openflow.md` lists what is decoded and refused.
#![forbid(unsafe_code)]

pub mod action;
pub mod bundle;
#[cfg(test)]
mod conj_tests;
pub mod error;
mod framer;
pub mod learn;
#[cfg(test)]
mod learn_tests;
pub mod message;
pub mod multipart;
pub mod nicira;
pub mod nx_msg;
pub mod oxm;
pub mod port;
mod wire;

#[cfg(test)]
mod cont_tests;
#[cfg(test)]
mod ct_tests;
#[cfg(test)]
mod of15_tests;
#[cfg(test)]
mod ovn_tests;
#[cfg(test)]
mod pktlen_tests;
#[cfg(test)]
mod regs_tests;
#[cfg(test)]
mod tests;

pub use action::{Action, Instruction};
pub use error::OfError;
pub use framer::{FrameError, Framer};
pub use message::{
    decode, encode, encode_with_version, negotiate, AsyncConfig, Bucket, ErrorMsg, FlowMod,
    FlowRemoved, GroupMod, Header, Message, MeterBand, MeterMod, PacketIn, PacketOut, PortMod,
    Role, SelectionMethod, SwitchConfig, SwitchFeatures,
};
pub use multipart::{
    encode_multipart_reply, encode_multipart_reply_with_version, MultipartReply,
    MultipartReplyBody, MultipartRequest, MultipartRequestBody,
};
pub use oxm::{Field, Match, Oxm};
pub use port::Port;

/// OpenFlow 1.0's wire version.
pub const VERSION_1_0: u8 = 0x01;
/// OpenFlow 1.3's wire version.
pub const VERSION_1_3: u8 = 0x04;
/// OpenFlow 1.4's wire version.
pub const VERSION_1_4: u8 = 0x05;
/// OpenFlow 1.5's wire version.
pub const VERSION_1_5: u8 = 0x06;
/// `ofp_header`'s length.
pub const HEADER_LEN: usize = 8;
/// The longest message the 16-bit length field allows.
pub const MAX_MESSAGE_LEN: usize = 65535;
