package nameset

import (
	"crypto/sha256"
	"fmt"
	"maps"
	"slices"
	"testing"
)

func TestNamesRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 3, 200000} {
		names := make([]string, n)
		for i := range names {
			// Hex of a hash: little to compress, so that the set takes
			// several chunks.
			names[i] = fmt.Sprintf("%06d-%x\n/\x00", i, sha256.Sum256([]byte{byte(i), byte(i >> 8), byte(i >> 16)}))
		}
		chunks := Encode(names)
		for _, c := range chunks {
			if len(c) > MaxChunk {
				t.Fatalf("a chunk of %d bytes", len(c))
			}
		}
		got, err := Decode(chunks)
		if err != nil {
			t.Fatal(err)
		}
		if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, names) && !(n == 0 && len(keys) == 0) {
			t.Errorf("%d names: got %d back", n, len(keys))
		}
		if n == 200000 && len(chunks) < 2 {
			t.Errorf("%d names in %d chunk: the test checks too little", n, len(chunks))
		}
	}
	if _, err := Decode([][]byte{[]byte("not deflate")}); err == nil {
		t.Error("garbage decoded")
	}
}
