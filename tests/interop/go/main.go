// Command a2a03client calls an A2A agent with the a2a-go v0.3.3 client, as it comes.
//
// It reads a JSON config (argv[1]) and prints one JSON object per step on stdout, so
// tests/interop/test_go_client.py can judge every answer. The client is used with its
// defaults: the card from /.well-known/agent-card.json, NewFromCard, JSON-RPC; only the
// http.Client is ours, for the client certificate.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/a2a"
	"github.com/a2aproject/a2a-go/a2aclient"
	"github.com/a2aproject/a2a-go/a2aclient/agentcard"
)

type config struct {
	BaseURL     string `json:"base_url"`
	CA          string `json:"ca"`
	Cert        string `json:"cert"`
	Key         string `json:"key"`
	OtherTaskID string `json:"other_task_id"`
	Refused     string `json:"refused_capability"`
	LargeBytes  int    `json:"large_bytes"`
	// PinServerID: the server's SVID may carry only its SPIFFE ID, so no host name is checked;
	// the chain is verified to the CA and the one URI SAN must be this ID. WrongServerID: the
	// same call, pinned to another ID, must fail.
	PinServerID   string `json:"pin_server_id"`
	WrongServerID string `json:"wrong_server_id"`
}

// pinSpiffeID verifies, instead of a host name, the chain to roots and the leaf's one URI SAN.
func pinSpiffeID(tlsConfig *tls.Config, roots *x509.CertPool, want string) {
	tlsConfig.InsecureSkipVerify = true // the host name check only: VerifyConnection does the rest
	tlsConfig.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return fmt.Errorf("no server certificate")
		}
		intermediates := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			intermediates.AddCert(c)
		}
		leaf := cs.PeerCertificates[0]
		opts := x509.VerifyOptions{
			Roots: roots, Intermediates: intermediates,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}
		if _, err := leaf.Verify(opts); err != nil {
			return err
		}
		if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
			return fmt.Errorf("server is not %s", want)
		}
		return nil
	}
}

func httpClient(cfg config, withCert bool) *http.Client {
	return pinnedClient(cfg, withCert, cfg.PinServerID)
}

func pinnedClient(cfg config, withCert bool, pin string) *http.Client {
	caPEM, err := os.ReadFile(cfg.CA)
	if err != nil {
		fail(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	tlsConfig := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if pin != "" {
		pinSpiffeID(tlsConfig, roots, pin)
	}
	if withCert {
		cert, err := tls.LoadX509KeyPair(cfg.Cert, cfg.Key)
		if err != nil {
			fail(err)
		}
		tlsConfig.Certificates = []tls.Certificate{cert}
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(2)
}

func emit(step string, fields map[string]any) {
	fields["step"] = step
	line, _ := json.Marshal(fields)
	fmt.Println(string(line))
}

func message(capability string, part a2a.Part) *a2a.MessageSendParams {
	msg := a2a.NewMessage(a2a.MessageRoleUser, part)
	msg.Metadata = map[string]any{"a2agw.capability": capability}
	return &a2a.MessageSendParams{Message: msg}
}

func send(ctx context.Context, step string, client *a2aclient.Client, params *a2a.MessageSendParams) a2a.TaskID {
	res, err := client.SendMessage(ctx, params)
	if err != nil {
		emit(step, map[string]any{"error": err.Error()})
		return ""
	}
	task, ok := res.(*a2a.Task)
	if !ok {
		emit(step, map[string]any{"kind": fmt.Sprintf("%T", res)})
		return ""
	}
	fields := map[string]any{"kind": "task", "id": string(task.ID), "state": string(task.Status.State)}
	if len(task.Artifacts) > 0 && len(task.Artifacts[0].Parts) > 0 {
		if data, ok := task.Artifacts[0].Parts[0].(a2a.DataPart); ok {
			fields["output"] = data.Data
		}
	}
	emit(step, fields)
	return task.ID
}

func main() {
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fail(err)
	}
	var cfg config
	if err := json.Unmarshal(raw, &cfg); err != nil {
		fail(err)
	}
	ctx := context.Background()

	// The public card, read without a client certificate (as any client first does).
	card, err := agentcard.NewResolver(httpClient(cfg, false)).Resolve(ctx, cfg.BaseURL)
	if err != nil {
		emit("card", map[string]any{"error": err.Error()})
		os.Exit(0)
	}
	emit("card", map[string]any{
		"url": card.URL, "preferredTransport": string(card.PreferredTransport),
		"protocolVersion": card.ProtocolVersion, "streaming": card.Capabilities.Streaming,
		"additionalInterfaces": card.AdditionalInterfaces,
	})

	client, err := a2aclient.NewFromCard(ctx, card, a2aclient.WithJSONRPCTransport(httpClient(cfg, true)))
	if err != nil {
		emit("client", map[string]any{"error": err.Error()})
		os.Exit(0)
	}
	taskID := send(ctx, "send_data", client, message("text.echo", a2a.DataPart{Data: map[string]any{"text": "hello"}}))
	if cfg.PinServerID != "" {
		wrong, err := a2aclient.NewFromCard(ctx, card, a2aclient.WithJSONRPCTransport(pinnedClient(cfg, true, cfg.WrongServerID)))
		if err != nil {
			fail(err)
		}
		send(ctx, "wrong_identity", wrong, message("text.echo", a2a.DataPart{Data: map[string]any{"text": "not for you"}}))
		return
	}
	send(ctx, "send_text", client, message("text.echo", a2a.TextPart{Text: "hello text"}))
	send(ctx, "refused", client, message(cfg.Refused, a2a.DataPart{Data: map[string]any{"id": "n1"}}))

	var events []string
	for event, err := range client.SendStreamingMessage(ctx, message("text.echo", a2a.DataPart{Data: map[string]any{"text": "streamed"}})) {
		if err != nil {
			events = append(events, "error: "+err.Error())
			break
		}
		switch e := event.(type) {
		case *a2a.Task:
			events = append(events, "task:"+string(e.Status.State))
		case *a2a.TaskStatusUpdateEvent:
			events = append(events, "status-update:"+string(e.Status.State))
		case *a2a.TaskArtifactUpdateEvent:
			events = append(events, "artifact-update")
		default:
			events = append(events, fmt.Sprintf("%T", event))
		}
	}
	emit("stream", map[string]any{"events": events})

	if task, err := client.GetTask(ctx, &a2a.TaskQueryParams{ID: taskID}); err != nil {
		emit("get_own", map[string]any{"error": err.Error()})
	} else {
		emit("get_own", map[string]any{"id": string(task.ID), "state": string(task.Status.State)})
	}
	if task, err := client.GetTask(ctx, &a2a.TaskQueryParams{ID: a2a.TaskID(cfg.OtherTaskID)}); err != nil {
		emit("get_other", map[string]any{"error": err.Error()})
	} else {
		emit("get_other", map[string]any{"id": string(task.ID)})
	}

	large := a2a.DataPart{Data: map[string]any{"text": strings.Repeat("x", cfg.LargeBytes)}}
	send(ctx, "too_large", client, message("text.echo", large))

	anonymous, err := a2aclient.NewFromCard(ctx, card, a2aclient.WithJSONRPCTransport(httpClient(cfg, false)))
	if err != nil {
		fail(err)
	}
	send(ctx, "no_cert", anonymous, message("text.echo", a2a.DataPart{Data: map[string]any{"text": "hi"}}))
}
