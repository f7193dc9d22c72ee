package failpoint

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestHandler(t *testing.T) {
	var s Set
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()

	resp, err := http.Post(srv.URL, "application/json", strings.NewReader(`{"fsync_delay":"20ms","fsync_fail":true,"clock_skew":"-2s"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST: %s", resp.Status)
	}
	got := s.Settings()
	if time.Duration(got.FsyncDelay) != 20*time.Millisecond || !got.FsyncFail || time.Duration(got.ClockSkew) != -2*time.Second {
		t.Fatalf("settings %+v", got)
	}
	if skew := time.Until(s.Now()); skew > -1900*time.Millisecond || skew < -2100*time.Millisecond {
		t.Fatalf("Now is %v from time.Now, want about -2s", skew)
	}

	for _, bad := range []string{`{"fsync_delay":"2h"}`, `{"clock_skew":"48h"}`, `{"nope":1}`, `{"fsync_delay":"x"}`} {
		resp, err := http.Post(srv.URL, "application/json", strings.NewReader(bad))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("POST %s: %s, want 400", bad, resp.Status)
		}
	}
	if s.Settings() != got {
		t.Fatalf("a refused POST changed the settings: %+v", s.Settings())
	}
	resp, err = http.Post(srv.URL, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if s.Settings() != (Settings{}) {
		t.Fatalf("{} left %+v", s.Settings())
	}
}
