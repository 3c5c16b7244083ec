package agent

import "testing"

// The relay forgets torch's c10d nodes after a round unless the master
// knows none departed: a scale-up's round has nothing to forget, and
// aging the live nodes' heartbeats there while a slow newcomer started
// made them look dead to torch (TestCommandScaleUp under load).
func TestForgetsLostOnlyWhereNodesMayBeLost(t *testing.T) {
	for _, c := range []struct {
		r    Round
		want bool
	}{
		{Round{Departed: 0, DepartedKnown: true}, false},
		{Round{Departed: 1, DepartedKnown: true}, true},
		{Round{Departed: 0}, true}, // a restarted master, or one before the count was marked known
		{Round{Departed: 2}, true},
	} {
		if got := forgetsLost(c.r); got != c.want {
			t.Errorf("forgetsLost(departed %d, known %v) = %v, want %v", c.r.Departed, c.r.DepartedKnown, got, c.want)
		}
	}
}
