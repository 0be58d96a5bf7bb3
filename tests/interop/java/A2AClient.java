// The A2A Java SDK's 0.3 client (io.github.a2asdk 0.3.0.Final, JSON-RPC) with its defaults.
//
// Run by tests/interop/test_java_a2a_client.py with Java's single-file source launcher:
// java -cp CLASSPATH A2AClient.java CONFIG.json. It reads the public card, builds its client
// from it (streaming, as the card says streaming: true) and prints one JSON object per step.
// Only the TLS context is ours (the client certificate, the CA).

import com.fasterxml.jackson.databind.ObjectMapper;
import io.a2a.A2A;
import io.a2a.client.Client;
import io.a2a.client.ClientEvent;
import io.a2a.client.MessageEvent;
import io.a2a.client.TaskEvent;
import io.a2a.client.TaskUpdateEvent;
import io.a2a.client.http.JdkA2AHttpClient;
import io.a2a.client.transport.jsonrpc.JSONRPCTransport;
import io.a2a.client.transport.jsonrpc.JSONRPCTransportConfig;
import io.a2a.spec.AgentCard;
import io.a2a.spec.DataPart;
import io.a2a.spec.Message;
import io.a2a.spec.Part;
import io.a2a.spec.Task;
import io.a2a.spec.TaskQueryParams;
import io.a2a.spec.TaskStatusUpdateEvent;
import io.a2a.spec.TextPart;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.cert.CertificateFactory;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.BiConsumer;
import java.util.function.Consumer;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;
import java.net.Socket;
import java.security.cert.CertificateException;
import java.security.cert.X509Certificate;
import java.util.Collection;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.TrustManager;
import javax.net.ssl.X509ExtendedTrustManager;
import javax.net.ssl.X509TrustManager;

public class A2AClient {
  static final ObjectMapper JSON = new ObjectMapper();

  static SSLContext tls(Map<String, Object> cfg, boolean withCert) throws Exception {
    KeyStore trust = KeyStore.getInstance("PKCS12");
    trust.load(null, null);
    try (InputStream in = Files.newInputStream(Path.of((String) cfg.get("ca")))) {
      trust.setCertificateEntry("ca", CertificateFactory.getInstance("X.509").generateCertificate(in));
    }
    TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
    tmf.init(trust);
    KeyManagerFactory kmf = null;
    if (withCert) {
      char[] password = ((String) cfg.get("p12_password")).toCharArray();
      KeyStore keys = KeyStore.getInstance("PKCS12");
      try (InputStream in = Files.newInputStream(Path.of((String) cfg.get("p12")))) {
        keys.load(in, password);
      }
      kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
      kmf.init(keys, password);
    }
    TrustManager[] trusted = tmf.getTrustManagers();
    if (cfg.get("pin_server_id") != null) {
      trusted = new TrustManager[] {new PinnedSpiffeId((X509TrustManager) trusted[0], (String) cfg.get("pin_server_id"))};
    }
    SSLContext context = SSLContext.getInstance("TLS");
    context.init(kmf == null ? null : kmf.getKeyManagers(), trusted, null);
    return context;
  }

  /**
   * With "pin_server_id": the server's SVID may carry only its SPIFFE ID, so no host name is
   * checked. The chain is verified to the CA (the default trust manager's two-argument check,
   * which checks no host name) and the leaf's one URI SAN must be the expected ID.
   */
  static final class PinnedSpiffeId extends X509ExtendedTrustManager {
    final X509TrustManager chain;
    final String want;

    PinnedSpiffeId(X509TrustManager chain, String want) {
      this.chain = chain;
      this.want = want;
    }

    void check(X509Certificate[] certs, String authType) throws CertificateException {
      chain.checkServerTrusted(certs, authType);
      List<String> uris = new ArrayList<>();
      Collection<List<?>> names = certs[0].getSubjectAlternativeNames();
      if (names != null) {
        for (List<?> name : names) {
          if ((Integer) name.get(0) == 6) uris.add((String) name.get(1));
        }
      }
      if (uris.size() != 1 || !uris.get(0).equals(want)) {
        throw new CertificateException("server is not " + want);
      }
    }

    @Override public void checkServerTrusted(X509Certificate[] c, String a) throws CertificateException { check(c, a); }
    @Override public void checkServerTrusted(X509Certificate[] c, String a, Socket s) throws CertificateException { check(c, a); }
    @Override public void checkServerTrusted(X509Certificate[] c, String a, SSLEngine e) throws CertificateException { check(c, a); }
    @Override public void checkClientTrusted(X509Certificate[] c, String a) throws CertificateException { throw new CertificateException("a client only"); }
    @Override public void checkClientTrusted(X509Certificate[] c, String a, Socket s) throws CertificateException { throw new CertificateException("a client only"); }
    @Override public void checkClientTrusted(X509Certificate[] c, String a, SSLEngine e) throws CertificateException { throw new CertificateException("a client only"); }
    @Override public X509Certificate[] getAcceptedIssuers() { return chain.getAcceptedIssuers(); }
  }

  static void emit(String step, Map<String, Object> fields) throws Exception {
    Map<String, Object> line = new LinkedHashMap<>(fields);
    line.put("step", step);
    System.out.println(JSON.writeValueAsString(line));
  }

  static Message message(String capability, Part<?> part) {
    return new Message.Builder()
        .role(Message.Role.USER)
        .parts(List.of(part))
        .metadata(Map.of("a2agw.capability", capability))
        .build();
  }

  /** Sends one message and follows its events to the last (the client streams by default). */
  static Map<String, Object> send(Client client, Message message) throws Exception {
    CompletableFuture<Map<String, Object>> done = new CompletableFuture<>();
    List<String> events = new ArrayList<>();
    BiConsumer<ClientEvent, AgentCard> consumer = (event, card) -> {
      Task task = null;
      if (event instanceof TaskEvent taskEvent) {
        task = taskEvent.getTask();
        events.add("task:" + task.getStatus().state().asString());
      } else if (event instanceof TaskUpdateEvent update) {
        task = update.getTask();
        if (update.getUpdateEvent() instanceof TaskStatusUpdateEvent status) {
          events.add("status-update:" + status.getStatus().state().asString());
        } else {
          events.add("artifact-update");
        }
      } else if (event instanceof MessageEvent) {
        events.add("message");
        done.complete(Map.of("events", events));
        return;
      }
      if (task != null && task.getStatus().state().isFinal()) {
        Map<String, Object> result = new LinkedHashMap<>();
        result.put("events", events);
        result.put("id", task.getId());
        result.put("state", task.getStatus().state().asString());
        if (!task.getArtifacts().isEmpty()
            && task.getArtifacts().get(0).parts().get(0) instanceof DataPart data) {
          result.put("output", data.getData());
        }
        done.complete(result);
      }
    };
    Consumer<Throwable> onError = error -> done.complete(Map.of("error", String.valueOf(error.getMessage())));
    try {
      client.sendMessage(message, List.of(consumer), onError, null);
    } catch (Exception error) {
      return Map.of("error", String.valueOf(error.getMessage()));
    }
    return done.get(60, TimeUnit.SECONDS);
  }

  static Client client(AgentCard card) throws Exception {
    return Client.builder(card)
        .withTransport(JSONRPCTransport.class, new JSONRPCTransportConfig(new JdkA2AHttpClient()))
        .build();
  }

  @SuppressWarnings("unchecked")
  public static void main(String[] args) throws Exception {
    Map<String, Object> cfg = JSON.readValue(Files.readString(Path.of(args[0])), Map.class);
    String base = (String) cfg.get("base_url");
    // JdkA2AHttpClient takes the default SSL context: ours, with bob's certificate.
    SSLContext.setDefault(tls(cfg, true));
    AgentCard card = A2A.getAgentCard(new JdkA2AHttpClient(), base);
    emit("card", Map.of("url", card.url(), "preferredTransport", card.preferredTransport(),
        "protocolVersion", card.protocolVersion(), "streaming", card.capabilities().streaming()));
    Client client = client(card);
    Map<String, Object> sent = send(client, message("text.echo", new DataPart(Map.of("text", "hello"))));
    emit("send_data", sent);
    if (cfg.get("pin_server_id") != null) { // the same call, pinned to another SPIFFE ID: refused
      Map<String, Object> wrong = new LinkedHashMap<>(cfg);
      wrong.put("pin_server_id", cfg.get("wrong_server_id"));
      SSLContext.setDefault(tls(wrong, true));
      try { // the streaming client reports no TLS failure: the card fetch shows it
        A2A.getAgentCard(new JdkA2AHttpClient(), base);
        emit("wrong_identity", Map.of("served", true));
      } catch (Exception error) {
        Throwable cause = error;
        while (cause.getCause() != null) cause = cause.getCause();
        emit("wrong_identity", Map.of("error", String.valueOf(cause)));
      }
      System.exit(0);
    }
    emit("send_text", send(client, message("text.echo", new TextPart("hello text"))));
    emit("refused", send(client, message((String) cfg.get("refused_capability"),
        new DataPart(Map.of("id", "n1")))));
    try {
      Task own = client.getTask(new TaskQueryParams((String) sent.get("id")), null);
      emit("get_own", Map.of("id", own.getId(), "state", own.getStatus().state().asString()));
    } catch (Exception error) {
      emit("get_own", Map.of("error", String.valueOf(error.getMessage())));
    }
    try {
      Task other = client.getTask(new TaskQueryParams((String) cfg.get("other_task_id")), null);
      emit("get_other", Map.of("id", other.getId()));
    } catch (Exception error) {
      emit("get_other", Map.of("error", String.valueOf(error.getMessage())));
    }
    SSLContext.setDefault(tls(cfg, false));
    emit("no_cert", send(client(card), message("text.echo", new DataPart(Map.of("text", "hi")))));
    System.exit(0);
  }
}
