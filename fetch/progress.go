package fetch

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Progress counts a fetch's bytes and reports them with rate and ETA.
// A nil *Progress counts nothing.
type Progress struct {
	Total int64
	// Report gets bytes in hand, the total, the download rate (bytes/s,
	// over this run) and the time left at that rate; at most once per
	// Interval, and once more from Finish.
	Report   func(done, total int64, rate float64, eta time.Duration)
	Interval time.Duration // 0: DefaultProgressInterval

	start      time.Time
	done, down atomic.Int64
	mu         sync.Mutex
	last       time.Time
}

// NewProgress starts counting towards total.
func NewProgress(total int64, report func(done, total int64, rate float64, eta time.Duration)) *Progress {
	return &Progress{Total: total, Report: report, start: time.Now()}
}

func (p *Progress) skip(n int64) {
	if p != nil {
		p.done.Add(n)
	}
}

func (p *Progress) unskip(n int64) {
	if p != nil {
		p.done.Add(-n)
	}
}

// add counts n bytes received now.
func (p *Progress) add(n int64) {
	if p == nil {
		return
	}
	p.done.Add(n)
	p.down.Add(n)
	iv := p.Interval
	if iv <= 0 {
		iv = DefaultProgressInterval
	}
	p.mu.Lock()
	due := time.Since(p.last) >= iv
	if due {
		p.last = time.Now()
	}
	p.mu.Unlock()
	if due {
		p.report()
	}
}

// Downloaded is the bytes received in this run.
func (p *Progress) Downloaded() int64 { return p.down.Load() }

// Rate is the download rate of this run so far in bytes per second.
func (p *Progress) Rate() float64 {
	el := time.Since(p.start).Seconds()
	if el <= 0 {
		return 0
	}
	return float64(p.down.Load()) / el
}

func (p *Progress) report() {
	if p.Report == nil {
		return
	}
	done, rate := p.done.Load(), p.Rate()
	var eta time.Duration
	if rate > 0 && done < p.Total {
		eta = time.Duration(float64(p.Total-done) / rate * float64(time.Second))
	}
	p.Report(done, p.Total, rate, eta)
}

// Finish reports the final numbers.
func (p *Progress) Finish() {
	if p != nil {
		p.report()
	}
}

// Line formats a progress report as one line: "fetching  45% 20.1 MiB / 44.6 MiB  9.8 MiB/s  ETA 3s".
func Line(label string, done, total int64, rate float64, eta time.Duration) string {
	pct := 100
	if total > 0 {
		pct = int(done * 100 / total)
	}
	return fmt.Sprintf("%s %3d%% %s / %s  %s/s  ETA %s", label, pct, human(done), human(total), human(int64(rate)), eta.Round(time.Second))
}

func human(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
