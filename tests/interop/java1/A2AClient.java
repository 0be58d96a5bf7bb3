// The A2A Java SDK's 1.0 client (io.github.a2asdk 1.0.0.Alpha3) over JSON-RPC and HTTP+JSON.
//
// Run by tests/interop/test_a2a_java_1_0_client.py with Java's single-file source launcher:
// java -cp CLASSPATH A2AClient.java CONFIG.json. It reads the public card, builds one client per
// binding from it (the SDK picks the card's interface for the transport it is given) and prints
// one JSON object per step. Ours: the TLS context (client certificate, CA), and three work-arounds
// for Alpha3 gaps, each named where it is made (see the test's docstring for why):
//  1. the card is parsed leniently (Alpha3's parser refuses fields it does not know);
//  2. "A2A-Version: 1.0" is passed as a call header (Alpha3 sends no version header);
//  3. a polling client's HTTP client sets 1.0's "returnImmediately" (Alpha3 knows only "blocking").

import com.google.gson.Gson;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.protobuf.util.JsonFormat;
import io.a2a.A2A;
import io.a2a.client.Client;
import io.a2a.client.ClientEvent;
import io.a2a.client.MessageEvent;
import io.a2a.client.TaskEvent;
import io.a2a.client.TaskUpdateEvent;
import io.a2a.client.config.ClientConfig;
import io.a2a.client.http.A2AHttpClient;
import io.a2a.client.http.A2AHttpResponse;
import io.a2a.client.http.JdkA2AHttpClient;
import io.a2a.client.transport.grpc.GrpcTransport;
import io.a2a.client.transport.grpc.GrpcTransportConfigBuilder;
import io.a2a.client.transport.jsonrpc.JSONRPCTransport;
import io.a2a.client.transport.jsonrpc.JSONRPCTransportConfigBuilder;
import io.a2a.client.transport.rest.RestTransport;
import io.a2a.client.transport.rest.RestTransportConfigBuilder;
import io.a2a.client.transport.spi.interceptors.ClientCallContext;
import io.a2a.grpc.utils.ProtoUtils;
import io.a2a.spec.A2AError;
import io.a2a.spec.AgentCard;
import io.a2a.spec.AgentInterface;
import io.a2a.spec.DataPart;
import io.a2a.spec.Message;
import io.a2a.spec.Part;
import io.a2a.spec.Task;
import io.a2a.spec.TaskIdParams;
import io.a2a.spec.TaskQueryParams;
import io.a2a.spec.TaskState;
import io.a2a.spec.TaskStatusUpdateEvent;
import io.a2a.spec.TextPart;
import io.grpc.netty.shaded.io.grpc.netty.GrpcSslContexts;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.cert.CertificateFactory;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
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
  static final Gson JSON = new Gson();
  static Map<String, Object> CONFIG;
  /** Work-around 2: Alpha3 sends no A2A-Version (1.0 clients MUST); the SDK's way to add a header. */
  static final ClientCallContext V1 = new ClientCallContext(Map.of(), Map.of("A2A-Version", "1.0"));

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

  /**
   * The SDK's JDK HTTP client (default SSL context: ours), with work-around 3 for a polling client.
   * Alpha3 still has the draft's SendMessageConfiguration.blocking (a polling client asks for
   * blocking = false, which the REST transport does not even print, false being the default);
   * A2A 1.0 renamed it return_immediately and inverted it, and ignores the unknown field, so the
   * request would block. For a polling client this sets configuration.returnImmediately on the
   * SendMessageRequest of the JSON body (JSON-RPC: its params); nothing else is touched.
   */
  static final class Http implements A2AHttpClient {
    final JdkA2AHttpClient jdk = new JdkA2AHttpClient();
    final boolean polling;

    Http(boolean polling) { this.polling = polling; }

    String body(String body) {
      JsonObject root = JsonParser.parseString(body).getAsJsonObject();
      JsonObject request = root.has("params") ? root.getAsJsonObject("params") : root;
      if (!polling || !request.has("message")) {
        return body;
      }
      JsonObject configuration = request.has("configuration") ? request.getAsJsonObject("configuration") : new JsonObject();
      configuration.remove("blocking");
      configuration.addProperty("returnImmediately", true);
      request.add("configuration", configuration);
      return root.toString();
    }

    @Override public GetBuilder createGet() { return jdk.createGet(); }
    @Override public DeleteBuilder createDelete() { return jdk.createDelete(); }

    @Override public PostBuilder createPost() {
      PostBuilder post = jdk.createPost();
      return new PostBuilder() {
        @Override public PostBuilder body(String body) { post.body(Http.this.body(body)); return this; }
        @Override public A2AHttpResponse post() throws IOException, InterruptedException { return post.post(); }
        @Override public CompletableFuture<Void> postAsyncSSE(Consumer<String> messages,
            Consumer<Throwable> errors, Runnable done) throws IOException, InterruptedException {
          return post.postAsyncSSE(messages, errors, done);
        }
        @Override public PostBuilder url(String url) { post.url(url); return this; }
        @Override public PostBuilder addHeader(String name, String value) { post.addHeader(name, value); return this; }
        @Override public PostBuilder addHeaders(Map<String, String> headers) { post.addHeaders(headers); return this; }
      };
    }
  }

  static void emit(String binding, String step, Map<String, Object> fields) {
    Map<String, Object> line = new LinkedHashMap<>(fields);
    line.put("binding", binding);
    line.put("step", step);
    System.out.println(JSON.toJson(line));
  }

  static Message message(String capability, Part<?> part) {
    return Message.builder()
        .role(Message.Role.ROLE_USER)
        .messageId(UUID.randomUUID().toString())
        .parts(List.of(part))
        .metadata(Map.of("a2agw.capability", capability))
        .build();
  }

  static String state(Task task) {
    return task.status().state().name();
  }

  static Object output(Task task) {
    if (task.artifacts() == null || task.artifacts().isEmpty()) {
      return null;
    }
    Part<?> part = task.artifacts().get(task.artifacts().size() - 1).parts().get(0);
    return part instanceof DataPart data ? data.data() : String.valueOf(part);
  }

  /** What the client raised: its message, and the A2A error class and code it mapped. */
  static Map<String, Object> error(Throwable error) {
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("error", String.valueOf(error.getMessage()));
    out.put("type", error.getClass().getSimpleName());
    for (Throwable cause = error; cause != null; cause = cause.getCause()) {
      if (cause instanceof A2AError a2a) {
        out.put("a2a_error", a2a.getClass().getSimpleName());
        out.put("code", a2a.getCode());
        break;
      }
    }
    return out;
  }

  /** Sends one message; follows its events to the first terminal one (or the one answer). */
  static Map<String, Object> send(Client client, boolean streaming, Message message) throws Exception {
    CompletableFuture<Map<String, Object>> done = new CompletableFuture<>();
    AtomicReference<Map<String, Object>> last = new AtomicReference<>();
    List<String> events = new ArrayList<>();
    BiConsumer<ClientEvent, AgentCard> consumer = (event, card) -> {
      Task task = null;
      if (event instanceof TaskEvent taskEvent) {
        task = taskEvent.getTask();
        events.add("task:" + state(task));
      } else if (event instanceof TaskUpdateEvent update) {
        task = update.getTask();
        if (update.getUpdateEvent() instanceof TaskStatusUpdateEvent status) {
          events.add("status:" + status.status().state().name());
        } else {
          events.add("artifact");
        }
      } else if (event instanceof MessageEvent) {
        events.add("message");
        done.complete(Map.of("events", events));
        return;
      }
      if (task != null) {
        Map<String, Object> result = new LinkedHashMap<>();
        result.put("events", events);
        result.put("id", task.id());
        result.put("state", state(task));
        result.put("output", output(task));
        last.set(result);
        if (task.status().state().isFinal()) {
          done.complete(result);
        }
      }
    };
    Consumer<Throwable> onError = failure -> { // null: the stream ended without an error
      Map<String, Object> ended = new LinkedHashMap<>(last.get() == null ? Map.of() : last.get());
      ended.put("events", events);
      done.complete(failure == null ? ended : error(failure));
    };
    try {
      client.sendMessage(message, List.of(consumer), onError, V1);
    } catch (Exception failure) {
      return error(failure);
    }
    if (!streaming) { // the one answer came back inside sendMessage (a polling client's: not terminal)
      return done.getNow(last.get());
    }
    return done.get(60, TimeUnit.SECONDS);
  }

  static Client client(AgentCard card, String binding, boolean streaming, boolean polling) throws Exception {
    ClientConfig config = new ClientConfig.Builder().setStreaming(streaming).setPolling(polling).build();
    var builder = Client.builder(card).clientConfig(config);
    if (binding.equals("GRPC")) {
      builder.withTransport(GrpcTransport.class, new GrpcTransportConfigBuilder().channelFactory(target -> {
        try { // mTLS; the server certificate is checked against the name derived from its SPIFFE ID
          return NettyChannelBuilder.forTarget(target)
              .overrideAuthority((String) CONFIG.get("server_dns_name"))
              .sslContext(GrpcSslContexts.forClient()
                  .trustManager(new File((String) CONFIG.get("ca")))
                  .keyManager(new File((String) CONFIG.get("cert")), new File((String) CONFIG.get("key")))
                  .build())
              .build();
        } catch (IOException failure) {
          throw new UncheckedIOException(failure);
        }
      }));
    } else if (binding.equals("JSONRPC")) {
      builder.withTransport(JSONRPCTransport.class, new JSONRPCTransportConfigBuilder().httpClient(new Http(polling)));
    } else {
      builder.withTransport(RestTransport.class, new RestTransportConfigBuilder().httpClient(new Http(polling)));
    }
    return builder.build();
  }

  /** GetTask until the task is in one of ``states``; the states seen on the way. */
  static List<String> poll(Client client, String id, TaskState... states) throws Exception {
    List<String> seen = new ArrayList<>();
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    while (System.nanoTime() < deadline) {
      Task task = client.getTask(new TaskQueryParams(id), V1);
      if (seen.isEmpty() || !seen.get(seen.size() - 1).equals(state(task))) {
        seen.add(state(task));
      }
      if (List.of(states).contains(task.status().state())) {
        return seen;
      }
      Thread.sleep(100);
    }
    seen.add("gave up");
    return seen;
  }

  static void run(Map<String, Object> cfg, AgentCard card, String binding) throws Exception {
    if (binding.equals("GRPC")) { // Alpha3's gRPC stubs are of a pre-1.0 draft: one call shows it
      emit(binding, "send_data", send(client(card, binding, false, false), false,
          message("text.echo", new DataPart(Map.of("text", "hello")))));
      return;
    }
    Client plain = client(card, binding, false, false);
    emit(binding, "send_data", send(plain, false, message("text.echo", new DataPart(Map.of("text", "hello")))));
    if (cfg.get("pin_server_id") != null) { // the same call, pinned to another SPIFFE ID: refused
      Map<String, Object> wrong = new LinkedHashMap<>(cfg);
      wrong.put("pin_server_id", cfg.get("wrong_server_id"));
      SSLContext.setDefault(tls(wrong, true));
      try { // the card fetch over the same TLS: the handshake refuses the server
        new JdkA2AHttpClient().createGet().url(cfg.get("base_url") + "/.well-known/agent-card.json").get();
        emit(binding, "wrong_identity", Map.of("served", true));
      } catch (Exception failure) {
        Throwable cause = failure;
        while (cause.getCause() != null) cause = cause.getCause();
        emit(binding, "wrong_identity", Map.of("error", String.valueOf(cause)));
      }
      SSLContext.setDefault(tls(cfg, true));
      return;
    }
    emit(binding, "send_text", send(plain, false, message("text.echo", new TextPart("hello text"))));
    Client streaming = client(card, binding, true, false);
    emit(binding, "stream", send(streaming, true, message("text.echo", new DataPart(Map.of("text", "streamed")))));

    Client polling = client(card, binding, false, true);
    Map<String, Object> paused = send(polling, false, message("job.pause", new DataPart(Map.of("tag", "p"))));
    Map<String, Object> polled = new LinkedHashMap<>(Map.of("answered", paused.getOrDefault("state", paused)));
    if (paused.containsKey("id")) {
      polled.put("seen", poll(polling, (String) paused.get("id"), TaskState.TASK_STATE_COMPLETED,
          TaskState.TASK_STATE_FAILED));
      polled.put("output", output(polling.getTask(new TaskQueryParams((String) paused.get("id")), V1)));
    }
    emit(binding, "polled", polled);

    String tag = binding + "-watch";
    Map<String, Object> watched = send(polling, false, message("job.watch", new DataPart(Map.of("tag", tag))));
    Map<String, Object> cancelled = new LinkedHashMap<>(Map.of("tag", tag, "answered", watched.getOrDefault("state", watched)));
    if (watched.containsKey("id")) {
      String id = (String) watched.get("id");
      cancelled.put("id", id);
      cancelled.put("seen", poll(polling, id, TaskState.TASK_STATE_WORKING));
      try {
        cancelled.put("state", state(polling.cancelTask(new TaskIdParams(id), V1)));
      } catch (Exception failure) {
        cancelled.putAll(error(failure));
      }
    }
    emit(binding, "cancelled", cancelled);

    emit(binding, "refused", send(plain, false, message((String) cfg.get("refused_capability"),
        new DataPart(Map.of("id", "n1")))));
    emit(binding, "refused_stream", send(streaming, true, message((String) cfg.get("refused_capability"),
        new DataPart(Map.of("id", "n2")))));
    try {
      Task own = plain.getTask(new TaskQueryParams(cfg.get("other_task_id").toString()), V1);
      emit(binding, "get_other", Map.of("id", own.id()));
    } catch (Exception failure) {
      emit(binding, "get_other", error(failure));
    }
  }

  /** Work-around 1: the SDK's own card parsing, but ignoring fields Alpha3 does not know. */
  static AgentCard lenientCard(String base) throws Exception {
    A2AHttpResponse answer = new JdkA2AHttpClient().createGet().url(base + "/.well-known/agent-card.json").get();
    io.a2a.grpc.AgentCard.Builder proto = io.a2a.grpc.AgentCard.newBuilder();
    JsonFormat.parser().ignoringUnknownFields().merge(answer.body(), proto);
    return ProtoUtils.FromProto.agentCard(proto);
  }

  @SuppressWarnings("unchecked")
  public static void main(String[] args) throws Exception {
    Map<String, Object> cfg = JSON.fromJson(Files.readString(Path.of(args[0])), Map.class);
    CONFIG = cfg;
    String base = (String) cfg.get("base_url");
    SSLContext.setDefault(tls(cfg, true)); // JdkA2AHttpClient takes the default SSL context
    AgentCard card;
    try {
      card = A2A.getAgentCard(new JdkA2AHttpClient(), base);
      emit("", "sdk_card", Map.of("ok", true));
    } catch (Exception failure) {
      Map<String, Object> out = error(failure);
      out.put("cause", String.valueOf(failure.getCause() == null ? null : failure.getCause().getMessage()));
      emit("", "sdk_card", out);
      card = lenientCard(base);
    }
    List<List<String>> interfaces = new ArrayList<>();
    for (AgentInterface i : card.supportedInterfaces()) {
      interfaces.add(List.of(i.protocolBinding(), i.protocolVersion(), i.url()));
    }
    emit("", "card", Map.of("interfaces", interfaces, "streaming", card.capabilities().streaming(),
        "extended", card.capabilities().extendedAgentCard(), "name", card.name()));
    for (Object binding : (List<Object>) cfg.get("bindings")) {
      try {
        run(cfg, card, (String) binding);
      } catch (Exception failure) {
        emit((String) binding, "crashed", error(failure));
      }
    }
    if (Boolean.TRUE.equals(cfg.get("no_cert"))) {
      SSLContext.setDefault(tls(cfg, false));
      emit("JSONRPC", "no_cert", send(client(card, "JSONRPC", false, false), false,
          message("text.echo", new DataPart(Map.of("text", "hi")))));
    }
    System.exit(0);
  }
}
