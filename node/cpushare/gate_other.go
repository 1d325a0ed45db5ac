//go:build !unix

package cpushare

import "errors"

// mapClaims: no shared mapping here (Windows); the static share applies.
func mapClaims(string) ([]byte, func(), error) {
	return nil, nil, errors.New("cpushare: no claims file on this platform")
}
