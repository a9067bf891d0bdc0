// The fuzz targets' input: bytes decoded field by field into a struct, so
// a field added to ControllerParams or to a status is fuzzed without
// touching a target or a seed.

package controller

import (
	"encoding/binary"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// decodeFuzz fills the struct v points to from data, one exported field
// after another in declaration order, nested structs included, and returns
// v:
//
//	bool                 1 byte, its low bit
//	int and uint kinds   8 bytes, little-endian, truncated to the field's size
//	string               1 byte n, then n bytes (fewer when data runs out)
//	[]byte               2 bytes n, little-endian, then n bytes
//	time.Time            1 byte (low bit 0: the zero time), then 8 bytes of
//	                     Unix seconds and 8 of nanoseconds, in UTC
//	pointer              1 byte (low bit 0: nil), then what it points to
//	struct               its fields
//
// Fields of other kinds (funcs, interfaces, channels, maps) are left as
// they are, for the target to set. Once data runs out, the remaining
// fields decode from zero bytes. Any data decodes: a fuzzer's mutation of
// the bytes is always an input.
//
// A target takes its input as a struct that holds the library's own type
// (ControllerParams, ControllerStatus) and decodes into it, so that a new
// field of that type is fuzzed from the next run on; seeds are written as
// struct literals and encoded with encodeFuzz, so they name their fields
// and survive new ones. A seed file that the fuzzer writes (a failure it
// found) holds bytes: after a field is added before the ones it sets, it
// still decodes, to another input.
func decodeFuzz[T any](data []byte, v *T) *T {
	d := fuzzDecoder{data: data}
	d.value(reflect.ValueOf(v).Elem())
	return v
}

// encodeFuzz returns the bytes decodeFuzz decodes into v, for seeds.
func encodeFuzz[T any](v T) []byte {
	var e fuzzEncoder
	e.value(reflect.ValueOf(v))
	return e.data
}

var timeType = reflect.TypeFor[time.Time]()

type fuzzDecoder struct{ data []byte }

// take returns the next n bytes, zeros past the end of the data.
func (d *fuzzDecoder) take(n int) []byte {
	b := make([]byte, n)
	d.data = d.data[copy(b, d.data):]
	return b
}

func (d *fuzzDecoder) flag() bool   { return d.take(1)[0]&1 == 1 }
func (d *fuzzDecoder) word() uint64 { return binary.LittleEndian.Uint64(d.take(8)) }

// bytes returns the next n bytes, fewer when the data runs out; nil for
// none.
func (d *fuzzDecoder) bytes(n int) []byte {
	if n = min(n, len(d.data)); n == 0 {
		return nil
	}
	return d.take(n)
}

func (d *fuzzDecoder) value(v reflect.Value) {
	if v.Type() == timeType {
		if d.flag() {
			sec, nsec := int64(d.word()), int64(d.word())
			v.Set(reflect.ValueOf(time.Unix(sec, nsec).UTC()))
		}
		return
	}
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(d.flag())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(d.word()))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		v.SetUint(d.word())
	case reflect.String:
		v.SetString(string(d.bytes(int(d.take(1)[0]))))
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			v.SetBytes(d.bytes(int(binary.LittleEndian.Uint16(d.take(2)))))
		}
	case reflect.Pointer:
		if d.flag() {
			p := reflect.New(v.Type().Elem())
			d.value(p.Elem())
			v.Set(p)
		} else {
			v.SetZero()
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				d.value(v.Field(i))
			}
		}
	}
}

// eachField calls fn with v and, through pointers and structs, every
// exported field below it that can be set: how a target reaches every
// string or time of an input, those of fields added later included.
func eachField(v reflect.Value, fn func(reflect.Value)) {
	fn(v)
	switch {
	case v.Kind() == reflect.Pointer && !v.IsNil():
		eachField(v.Elem(), fn)
	case v.Kind() == reflect.Struct && v.Type() != timeType:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				eachField(v.Field(i), fn)
			}
		}
	}
}

type fuzzEncoder struct{ data []byte }

func (e *fuzzEncoder) flag(b bool) {
	if b {
		e.data = append(e.data, 1)
	} else {
		e.data = append(e.data, 0)
	}
}

func (e *fuzzEncoder) word(u uint64) { e.data = binary.LittleEndian.AppendUint64(e.data, u) }

func (e *fuzzEncoder) value(v reflect.Value) {
	if v.Type() == timeType {
		t := v.Interface().(time.Time)
		e.flag(!t.IsZero())
		if !t.IsZero() {
			e.word(uint64(t.Unix()))
			e.word(uint64(t.Nanosecond()))
		}
		return
	}
	switch v.Kind() {
	case reflect.Bool:
		e.flag(v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		e.word(uint64(v.Int()))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		e.word(v.Uint())
	case reflect.String:
		s := v.String()[:min(v.Len(), 255)]
		e.data = append(append(e.data, byte(len(s))), s...)
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			b := v.Bytes()[:min(v.Len(), 1<<16-1)]
			e.data = append(binary.LittleEndian.AppendUint16(e.data, uint16(len(b))), b...)
		}
	case reflect.Pointer:
		e.flag(!v.IsNil())
		if !v.IsNil() {
			e.value(v.Elem())
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				e.value(v.Field(i))
			}
		}
	}
}

// decodeFuzz and encodeFuzz are inverses on every kind they handle, so a
// seed decodes to the literal it was written as; short data decodes to
// zero fields; and a field added to a struct is decoded with no change to
// the decoder.
func TestFuzzInputRoundTrip(t *testing.T) {
	type inner struct {
		B []byte
		T time.Time
	}
	type input struct {
		Flag       bool
		N          int
		D          time.Duration
		Small      uint8
		S          string
		Ptr        *inner
		Nested     inner
		Fn         func() // left alone
		unexported int    // left alone
	}
	in := input{Flag: true, N: -7, D: time.Hour, Small: 200, S: "ünï", Ptr: &inner{B: []byte{0, 1}, T: time.Unix(1, 2).UTC()},
		Nested: inner{T: time.Unix(-62167219201, 999999999).UTC()}}
	got := decodeFuzz(encodeFuzz(in), new(input))
	require.Equal(t, in, *got)
	kept := decodeFuzz(encodeFuzz(in), &input{unexported: 7})
	require.Equal(t, 7, kept.unexported, "an unexported field is neither encoded nor decoded")

	require.Equal(t, input{}, *decodeFuzz(nil, new(input)), "no data: zero fields")
	short := encodeFuzz(in)[:3] // Flag, then the start of N
	require.Equal(t, input{Flag: true, N: int(binary.LittleEndian.Uint64([]byte{short[1], short[2], 0, 0, 0, 0, 0, 0}))}, *decodeFuzz(short, new(input)))

	// A struct that gained a field at the end decodes the old bytes as
	// before, the new field zero; a field anywhere is decoded.
	type grown struct {
		Input input
		Added time.Duration
	}
	require.Equal(t, grown{Input: in}, *decodeFuzz(encodeFuzz(in), new(grown)))
	require.Equal(t, grown{Input: in, Added: time.Minute}, *decodeFuzz(encodeFuzz(grown{in, time.Minute}), new(grown)))
}
