package config

import "encoding/json"

// CompactJSON renders an Ignition config (any of Ignition's config types) as JSON without the
// empty objects, empty lists and nulls its types leave behind ("proxy": {}, "user": {} …),
// indented by indent unless it is "". A list entry left empty becomes {} so that lists keep
// their length.
func CompactJSON(v any, indent string) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var tree any
	if err := json.Unmarshal(raw, &tree); err != nil {
		return nil, err
	}
	if indent == "" {
		return json.Marshal(dropEmpty(tree))
	}
	return json.MarshalIndent(dropEmpty(tree), "", indent)
}

// dropEmpty removes empty objects, empty lists and nulls from a decoded JSON tree; nil
// when v itself is empty.
func dropEmpty(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			if e = dropEmpty(e); e == nil {
				delete(t, k)
			} else {
				t[k] = e
			}
		}
		if len(t) == 0 {
			return nil
		}
	case []any:
		if len(t) == 0 {
			return nil
		}
		for i := range t {
			if t[i] = dropEmpty(t[i]); t[i] == nil {
				t[i] = map[string]any{}
			}
		}
	}
	return v
}
