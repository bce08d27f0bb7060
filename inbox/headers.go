package inbox

import (
	"encoding/binary"
	"errors"
	"sort"
)

// Headers are stored in the inbox's own encoding, byte for byte (not JSON:
// PostgreSQL's jsonb rejects NUL, MySQL's JSON reorders keys, and
// encoding/json replaces invalid UTF-8): a uvarint count, then for each
// header in key order the key's and the value's length (uvarint) and
// bytes. Empty or nil headers are stored as NULL.

func encodeHeaders(h map[string]string) any {
	if len(h) == 0 {
		return nil
	}
	keys := make([]string, 0, len(h))
	size := binary.MaxVarintLen64
	for k, v := range h {
		keys = append(keys, k)
		size += 2*binary.MaxVarintLen64 + len(k) + len(v)
	}
	sort.Strings(keys)
	b := make([]byte, 0, size)
	b = binary.AppendUvarint(b, uint64(len(keys)))
	for _, k := range keys {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		b = binary.AppendUvarint(b, uint64(len(h[k])))
		b = append(b, h[k]...)
	}
	return b
}

var errBadHeaders = errors.New("inbox: stored headers are corrupt")

func decodeHeaders(b []byte) (map[string]string, error) {
	if len(b) == 0 {
		return nil, nil
	}
	next := func() (string, error) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return "", errBadHeaders
		}
		s := string(b[k : k+int(n)])
		b = b[k+int(n):]
		return s, nil
	}
	count, k := binary.Uvarint(b)
	if k <= 0 || count > uint64(len(b)) {
		return nil, errBadHeaders
	}
	b = b[k:]
	h := make(map[string]string, count)
	for i := uint64(0); i < count; i++ {
		key, err := next()
		if err != nil {
			return nil, err
		}
		v, err := next()
		if err != nil {
			return nil, err
		}
		h[key] = v
	}
	if len(b) != 0 {
		return nil, errBadHeaders
	}
	return h, nil
}
