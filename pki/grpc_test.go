package pki

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// identityServer serves gRPC health with creds and records the identity
// of each caller (or the error reading it).
func identityServer(t *testing.T, creds credentials.TransportCredentials) (string, chan error, chan Identity) {
	t.Helper()
	errs, ids := make(chan error, 16), make(chan Identity, 16)
	opts := []grpc.ServerOption{grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		id, err := PeerIdentity(ctx)
		if err != nil {
			errs <- err
		} else {
			ids <- id
		}
		return h(ctx, req)
	})}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	s := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(s, health.NewServer())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return l.Addr().String(), errs, ids
}

func check(ctx context.Context, addr string, creds credentials.TransportCredentials) error {
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{})
	return err
}

// TestGRPCIdentities: the server reads a node's identity and a client's
// from their certificates, dialed by IP address; a plaintext caller has
// none; credentials made before a reload present the new certificate on
// their next connection.
func TestGRPCIdentities(t *testing.T) {
	ctx := context.Background()
	ca := newCA(t, "test ca")
	srvDir, cliDir := t.TempDir(), t.TempDir()
	writeNode(t, srvDir, ca, "us", 1)
	writeNode(t, cliDir, ca, "eu", 7)
	srv, cli := openNode(t, srvDir), openNode(t, cliDir)
	addr, errs, ids := identityServer(t, credentials.NewTLS(srv.ServerTLS()))

	creds := cli.ClientCredentials(RequireNode)
	if err := check(ctx, addr, creds); err != nil {
		t.Fatal(err)
	}
	if id := <-ids; id != NodeIdentity("eu", 7) {
		t.Fatalf("caller %v", id)
	}
	// A check that refuses the server's identity fails the dial.
	refused := cli.ClientCredentials(func(Identity) error { return errors.New("no") })
	if err := check(ctx, addr, refused); err == nil {
		t.Fatal("a refused server identity was accepted")
	}

	// Rotate the client's certificate: the same credentials present the
	// new one on a new connection.
	serial := writeNode(t, cliDir, ca, "eu", 7)
	if _, err := cli.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := check(ctx, addr, creds); err != nil {
		t.Fatal(err)
	}
	<-ids
	if cli.Leaf().SerialNumber.Cmp(serial) != 0 {
		t.Fatal("reload did not take the new certificate")
	}

	// A client principal.
	clientDir := t.TempDir()
	p, err := CreateClient(ca, "alice", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := WritePair(clientDir+"/"+ClientCertFile, clientDir+"/"+ClientKeyFile, p, false); err != nil {
		t.Fatal(err)
	}
	if err := WriteCACopy(clientDir+"/"+CACertFile, ca.CertPEM, false); err != nil {
		t.Fatal(err)
	}
	tcfg, err := ClientConfig(clientDir+"/"+CACertFile, clientDir+"/"+ClientCertFile, clientDir+"/"+ClientKeyFile, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := check(ctx, addr, credentials.NewTLS(tcfg)); err != nil {
		t.Fatal(err)
	}
	if id := <-ids; id != ClientIdentity("alice") {
		t.Fatalf("caller %v", id)
	}

	// Plaintext: no identity (and against the TLS server, no call).
	if err := check(ctx, addr, insecure.NewCredentials()); err == nil {
		t.Fatal("a plaintext call reached a TLS server")
	}
	plainAddr, plainErrs, _ := identityServer(t, nil)
	if err := check(ctx, plainAddr, insecure.NewCredentials()); err != nil {
		t.Fatal(err)
	}
	if err := <-plainErrs; !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("plaintext caller: %v", err)
	}
	select {
	case err := <-errs:
		t.Fatalf("a TLS caller had no identity: %v", err)
	default:
	}
}
