package fetch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// Errors of URL downloads callers can tell apart.
var (
	// ErrNoRange: the server answered a range request with the whole file.
	ErrNoRange = errors.New("the server ignores HTTP range requests (it answered 200 with the whole file); download the file and pass its path to --model")
	// ErrChanged: the file on the server changed during the download.
	ErrChanged = errors.New("the file on the server changed during the download")
)

// headerChunk is the first range read from a URL; it doubles until the
// GGUF header fits (up to gguf.MaxManifestHeader).
const headerChunk = 256 << 10

// URL reads a GGUF file on an HTTP(S) server by range requests. Redirects
// are followed (net/http keeps the Range header); a failed or cut request
// is retried with exponential backoff and resumed where it stopped, with
// If-Range so a file changed in between is noticed (ErrChanged).
type URL struct {
	URL    string
	Client *http.Client // default http.DefaultClient
	// Retries per request after the first attempt (0: DefaultURLRetries),
	// waiting Backoff (0: DefaultURLBackoff) doubling up to maxURLBackoff
	// between attempts.
	Retries int
	Backoff time.Duration
	// Idle bounds the wait for the answer's headers and then for each
	// read of its body (0: IdleTimeout); a server that stalls longer is
	// cut off and the request retried from where it stopped.
	Idle time.Duration
	Log  *slog.Logger

	size      int64
	validator string // ETag (strong) or Last-Modified of the first answer
}

func (u *URL) client() *http.Client {
	if u.Client != nil {
		return u.Client
	}
	return http.DefaultClient
}

// Size is the file size (known after Header).
func (u *URL) Size() int64 { return u.size }

// Header reads the GGUF header by range requests and parses it. hdr is
// exactly the header bytes (File.HeaderSize), what a Manifest carries.
func (u *URL) Header(ctx context.Context) (*gguf.File, []byte, error) {
	n := int64(headerChunk)
	for {
		var buf bytes.Buffer
		if err := u.get(ctx, 0, n, &buf); err != nil {
			return nil, nil, err
		}
		b := buf.Bytes()
		f, err := gguf.ReadHeader(b, u.size)
		if err == nil {
			return f, b[:f.HeaderSize], nil
		}
		if !errors.Is(err, gguf.ErrTruncated) || int64(len(b)) >= u.size || n >= gguf.MaxManifestHeader {
			return nil, nil, fmt.Errorf("fetch: %s: %w", u.URL, err)
		}
		n = min(2*n, gguf.MaxManifestHeader)
	}
}

// get writes bytes [off, off+n) of the file to w (fewer if the file ends
// first; the first call learns the size).
func (u *URL) get(ctx context.Context, off, n int64, w io.Writer) error {
	if u.size > 0 {
		n = min(n, u.size-off)
	}
	retries := u.Retries
	if retries <= 0 {
		retries = DefaultURLRetries
	}
	wait := u.Backoff
	if wait <= 0 {
		wait = DefaultURLBackoff
	}
	var done int64
	var lastErr error
	for attempt := 0; attempt <= retries; attempt++ {
		if attempt > 0 {
			if u.Log != nil {
				u.Log.Info("retrying download", "url", u.URL, "offset", off+done, "attempt", attempt, "err", lastErr)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
			wait = min(2*wait, maxURLBackoff)
		}
		k, err := u.once(ctx, off+done, n-done, w)
		done += k
		if err == nil && done == n {
			return nil
		}
		var perm permanent
		if errors.As(err, &perm) || ctx.Err() != nil {
			return err
		}
		if err == nil {
			err = fmt.Errorf("short answer: %d of %d bytes", done, n)
		}
		lastErr = err
	}
	return fmt.Errorf("fetch: %s: bytes %d-%d: gave up after %d attempts: %w", u.URL, off, off+n-1, retries+1, lastErr)
}

// permanent marks an error retrying will not fix.
type permanent struct{ error }

func (p permanent) Unwrap() error { return p.error }

// ErrStalled means an HTTP server sent nothing for the idle timeout.
var ErrStalled = errors.New("server stalled")

// idleBody is a response body whose every read that returns data pushes
// the idle watchdog back.
type idleBody struct {
	r  io.Reader
	wd *time.Timer
	d  time.Duration
}

func (b idleBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if n > 0 {
		b.wd.Reset(b.d)
	}
	return n, err
}

func (u *URL) once(ctx context.Context, off, n int64, w io.Writer) (int64, error) {
	idle := u.Idle
	if idle <= 0 {
		idle = IdleTimeout
	}
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stalled := fmt.Errorf("%w: nothing for %s", ErrStalled, idle)
	wd := time.AfterFunc(idle, func() { cancel(stalled) })
	defer wd.Stop()
	k, err := u.request(rctx, off, n, idleBody{wd: wd, d: idle}, w)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(rctx), ErrStalled) {
		err = fmt.Errorf("fetch: %s: bytes from %d: %w", u.URL, off+k, stalled)
	}
	return k, err
}

// request is one range request; body wraps the answer's body (its r is
// set here).
func (u *URL) request(ctx context.Context, off, n int64, body idleBody, w io.Writer) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.URL, nil)
	if err != nil {
		return 0, permanent{err}
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+n-1))
	if u.validator != "" {
		req.Header.Set("If-Range", u.validator)
	}
	resp, err := u.client().Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
		if u.validator != "" {
			return 0, permanent{fmt.Errorf("fetch: %s: %w (If-Range %s no longer matches)", u.URL, ErrChanged, u.validator)}
		}
		return 0, permanent{fmt.Errorf("fetch: %s: %w", u.URL, ErrNoRange)}
	case resp.StatusCode == http.StatusPartialContent:
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return 0, fmt.Errorf("HTTP %s", resp.Status)
	default:
		return 0, permanent{fmt.Errorf("fetch: %s: HTTP %s", u.URL, resp.Status)}
	}
	start, end, total, err := ParseContentRange(resp.Header.Get("Content-Range"))
	if err != nil {
		return 0, permanent{fmt.Errorf("fetch: %s: %w", u.URL, err)}
	}
	if u.size == 0 {
		if total <= 0 {
			return 0, permanent{fmt.Errorf("fetch: %s: the server does not say the file size (Content-Range %q)", u.URL, resp.Header.Get("Content-Range"))}
		}
		u.size = total
		if et := resp.Header.Get("ETag"); et != "" && !strings.HasPrefix(et, "W/") {
			u.validator = et
		} else {
			u.validator = resp.Header.Get("Last-Modified")
		}
		n = min(n, total-off)
	}
	if total > 0 && total != u.size {
		return 0, permanent{fmt.Errorf("fetch: %s: %w (size %d, was %d)", u.URL, ErrChanged, total, u.size)}
	}
	if start != off || end > off+n-1 {
		return 0, permanent{fmt.Errorf("fetch: %s: asked for bytes %d-%d, got %d-%d", u.URL, off, off+n-1, start, end)}
	}
	body.r = resp.Body
	k, err := io.Copy(w, io.LimitReader(body, end-start+1))
	if err == nil && k < end-start+1 {
		err = io.ErrUnexpectedEOF
	}
	return k, err
}

// ParseContentRange parses "bytes START-END/TOTAL" (TOTAL may be "*":
// total -1). Numbers have at most 18 digits; START <= END < TOTAL.
func ParseContentRange(s string) (start, end, total int64, err error) {
	bad := func() (int64, int64, int64, error) {
		return 0, 0, 0, fmt.Errorf("bad Content-Range %q", s)
	}
	rest, ok := strings.CutPrefix(s, "bytes ")
	if !ok {
		return bad()
	}
	rng, tot, ok := strings.Cut(rest, "/")
	if !ok {
		return bad()
	}
	a, b, ok := strings.Cut(rng, "-")
	if !ok {
		return bad()
	}
	num := func(x string) (int64, bool) {
		if x == "" || len(x) > 18 {
			return 0, false
		}
		for _, c := range x {
			if c < '0' || c > '9' {
				return 0, false
			}
		}
		v, err := strconv.ParseInt(x, 10, 64)
		return v, err == nil
	}
	var ok1, ok2 bool
	start, ok1 = num(a)
	end, ok2 = num(b)
	if !ok1 || !ok2 || start > end {
		return bad()
	}
	total = -1
	if tot != "*" {
		if total, ok = num(tot); !ok || end >= total {
			return bad()
		}
	}
	return start, end, total, nil
}
