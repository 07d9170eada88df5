//! What can go wrong reading, writing, encoding or decoding media, in words that name the file, container or
//! codec at fault.

use std::path::PathBuf;

/// A media failure.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// A media file could not be read or written.
    #[error("cannot access {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not in a container Kiln reads.
    #[error("{what}")]
    UnsupportedContainer {
        /// What the file was found to be.
        what: String,
    },
    /// A stream is coded with a codec Kiln does not decode or encode.
    #[error("{kind} codec `{codec}` is not supported: {supported}")]
    UnsupportedCodec {
        /// `video` or `audio`.
        kind: &'static str,
        /// The codec's name or sample-entry code (`hvc1`, `vp09`, ...).
        codec: String,
        /// What Kiln handles instead.
        supported: &'static str,
    },
    /// The container is damaged or uses a structure Kiln does not read.
    #[error("malformed MP4: {0}")]
    Malformed(String),
    /// The file holds no video stream.
    #[error("no video stream found in the file")]
    NoVideoStream,
    /// The video has no frames to work on.
    #[error("the video has no frames")]
    NoFrames,
    /// H.264 in 4:2:0 needs even dimensions (as x264 refuses odd ones).
    #[error("H.264 output requires even dimensions, got {width}x{height}")]
    OddDimensions {
        /// The frames' width.
        width: usize,
        /// The frames' height.
        height: usize,
    },
    /// The frames cannot be encoded as asked.
    #[error("cannot encode the video: {0}")]
    Encode(String),
    /// A stream could not be decoded.
    #[error("cannot decode the {kind} stream: {message}")]
    Decode {
        /// `video` or `audio`.
        kind: &'static str,
        /// What the decoder said.
        message: String,
    },
    /// A value given to a media operation is out of its range.
    #[error("{0}")]
    Invalid(String),
}
