// The encoding of a published set of names, and its decoding.

package nameset

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"errors"
	"io"
)

// MaxChunk bounds the bytes of one published chunk, well under etcd's
// default request limit of 1.5 MiB (a Put carries the key and some
// framing besides).
const MaxChunk = 512 << 10

// Encode returns names (sorted, for the compressor) as chunks of at
// most MaxChunk bytes: each name as a uvarint length and its bytes, the
// whole deflated. Lengths, not separators, since a name may hold any byte.
func Encode(names []string) [][]byte {
	var raw bytes.Buffer
	for _, n := range names {
		raw.Write(binary.AppendUvarint(nil, uint64(len(n))))
		raw.WriteString(n)
	}
	var z bytes.Buffer
	w, _ := flate.NewWriter(&z, flate.DefaultCompression) // the level is valid
	_, _ = w.Write(raw.Bytes())                           // a bytes.Buffer does not fail
	_ = w.Close()
	all := z.Bytes()
	var chunks [][]byte
	for len(all) > MaxChunk {
		chunks = append(chunks, all[:MaxChunk])
		all = all[MaxChunk:]
	}
	return append(chunks, all)
}

// Decode reverses encodeNames.
func Decode(chunks [][]byte) (map[string]struct{}, error) {
	raw, err := io.ReadAll(flate.NewReader(bytes.NewReader(bytes.Join(chunks, nil))))
	if err != nil {
		return nil, err
	}
	names := make(map[string]struct{})
	for len(raw) > 0 {
		n, k := binary.Uvarint(raw)
		if k <= 0 || uint64(len(raw)-k) < n {
			return nil, errors.New("ha: a published name set is malformed")
		}
		names[string(raw[k:k+int(n)])] = struct{}{}
		raw = raw[k+int(n):]
	}
	return names, nil
}
