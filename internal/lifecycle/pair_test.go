package lifecycle

import (
	"context"
	"errors"
	"testing"
)

// TestPairGuard: of a pair's two events, the first wins: a Beside leg's
// failure before the other leg's first byte cancels that leg's attempt
// with ErrPairFailed (and its own error) as the cause, and the leg is then
// not served; once the leg has its first byte, a failure of the Beside
// leg cancels nothing.
func TestPairGuard(t *testing.T) {
	boom := errors.New("connection refused")

	g := newPairGuard(context.Background())
	g.fail(boom)
	if !g.besideFailed() || g.served() {
		t.Error("a failure first: want the Beside leg failed, the leg not served")
	}
	if c := context.Cause(g.ctx); !errors.Is(c, ErrPairFailed) || !errors.Is(c, boom) {
		t.Errorf("cause %v: want ErrPairFailed and the failure", c)
	}

	g = newPairGuard(context.Background())
	first, again := g.served(), g.served()
	if !first || !again {
		t.Error("the first byte first: want served (and served again)")
	}
	g.fail(boom)
	if g.besideFailed() || g.ctx.Err() != nil {
		t.Errorf("a failure after the first byte: failed %v, context %v: want neither", g.besideFailed(), g.ctx.Err())
	}

	var none *pairGuard
	none.fail(boom) // a Beside leg outside a pair: nothing to cancel
}
