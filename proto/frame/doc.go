// Package frame is the stream framing used on every meshp2p libp2p stream.
//
// A frame is a fixed 8-byte prefix, a protobuf header and a raw payload:
//
//	offset 0  uint32 big-endian  header length H   (<= Limits.MaxHeader)
//	offset 4  uint32 big-endian  payload length P  (<= Limits.MaxPayload)
//	offset 8  H bytes            protobuf header
//	8+H       P bytes            payload
//
// The payload length is in the prefix, not only in the header, so every
// frame is self-delimiting: a reader that does not understand a header (a
// newer peer's message type) can still skip the frame. On session streams
// the header is a meshp2pb.StreamMessage and only activation frames carry a
// payload: the tensors' bytes in header order, without padding, P being the
// sum of TensorInfo.byte_length. Request/response protocols may use any
// message as the header (WriteMessage / ReadMessage) with P = 0.
//
// # Bounds
//
// Every read is bounded by Limits. Buffers grow with the bytes actually
// received (never to a declared size up front), so a peer that declares a
// large frame and sends nothing makes the reader allocate little. Decoding a
// protobuf header of H bytes allocates O(H) (Go structs for its fields).
//
// # Buffers
//
// A Reader reuses one payload buffer: the tensors returned by its Read
// methods alias it and are valid only until the next call on that Reader.
// Callers that keep tensors longer copy them, or use the package-level
// ReadActivation, which returns fresh memory. Tensors start 8-byte aligned in
// that buffer, so AsF32 / AsI32 return views without copying on
// little-endian machines. A Writer reuses one buffer for prefix + header and
// writes tensor bytes straight from the caller's slices (no copy). Neither
// type is safe for concurrent use; use one per stream direction.
//
// # Errors
//
// Read errors wrap ErrFrameTooLarge, ErrMalformed (also truncation, with
// io.ErrUnexpectedEOF), ErrChecksum or ErrUnsupportedDType; io.EOF alone
// means the stream ended cleanly at a frame boundary. After any other error
// the stream is out of sync: send an Error (ToProto) if possible and reset
// it. Code maps an error to a meshp2pb.ErrorCode.
package frame
