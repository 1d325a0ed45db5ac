package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Error is an OpenAI error object with its HTTP status. Backends return
// one (or wrap one) to choose the status a failure gets; any other error
// is a 500.
type Error struct {
	Status  int    `json:"-"`
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   any    `json:"param"` // the request field at fault, or null
	Code    any    `json:"code"`  // a machine-readable code, or null
	// RetryAfter, if positive, is sent as the Retry-After header (whole
	// seconds, rounded up): a model that is warming.
	RetryAfter time.Duration `json:"-"`
}

func (e *Error) Error() string { return fmt.Sprintf("api: %d %s", e.Status, e.Message) }

func newError(status int, typ, code, param, format string, args ...any) *Error {
	e := &Error{Status: status, Type: typ, Message: fmt.Sprintf(format, args...)}
	if code != "" {
		e.Code = code
	}
	if param != "" {
		e.Param = param
	}
	return e
}

// BadRequest is a 400 naming the request field at fault (param may be "").
func BadRequest(param, format string, args ...any) *Error {
	return newError(http.StatusBadRequest, "invalid_request_error", "", param, format, args...)
}

// unsupported is the 400 a field the gateway does not implement gets.
func unsupported(param, why string) *Error {
	e := BadRequest(param, "unsupported field %q: %s", param, why)
	e.Code = "unsupported_parameter"
	return e
}

// ModelNotFound is a 404 for a model no peer serves.
func ModelNotFound(model string) *Error {
	return newError(http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
		"the model %q does not exist: no peer of the swarm serves it (GET /v1/models lists what it can route)", model)
}

// Warming is a 503 for a model nobody serves yet that standby peers
// offer to load: the request made them start; retry after retry.
func Warming(retry time.Duration, format string, args ...any) *Error {
	e := newError(http.StatusServiceUnavailable, "server_error", "model_warming", "", format, args...)
	e.RetryAfter = retry
	return e
}

// Unavailable is a 503 with Retry-After UnavailableRetry: the model is
// known but no route covers it now (the message names the missing
// layers); a peer may serve them again (a restart, a self-placing node
// moving to them).
func Unavailable(format string, args ...any) *Error {
	e := newError(http.StatusServiceUnavailable, "server_error", "model_unavailable", "", format, args...)
	e.RetryAfter = UnavailableRetry
	return e
}

// SwarmFailed is a 503 for a generation the swarm could not finish (a
// hop refused or failed it and no re-route helped); message says why.
func SwarmFailed(format string, args ...any) *Error {
	return newError(http.StatusServiceUnavailable, "server_error", "generation_failed", "", format, args...)
}

var (
	errUnauthorized = newError(http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "",
		"missing or incorrect API key: send Authorization: Bearer <key>")
	errBusy = newError(http.StatusTooManyRequests, "requests", "rate_limit_exceeded", "",
		"the gateway is busy: every generation slot and queue place is taken; retry later")
)

func errTooLarge(limit int64) *Error {
	return newError(http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "",
		"request body larger than %d bytes", limit)
}

// asError turns any error into the object and status the client sees.
func asError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return newError(http.StatusInternalServerError, "server_error", "", "", "%v", err)
}

func writeError(w http.ResponseWriter, e *Error) {
	w.Header().Set("Content-Type", "application/json")
	errorHeaders(w, e)
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(map[string]*Error{"error": e})
}
