import java.io.IOException;
import java.lang.reflect.Method;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Enumeration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.jar.JarEntry;
import java.util.jar.JarFile;

import org.neo4j.dbms.api.DatabaseManagementService;
import org.neo4j.dbms.api.DatabaseManagementServiceBuilder;
import org.neo4j.graphdb.GraphDatabaseService;
import org.neo4j.kernel.api.procedure.GlobalProcedures;
import org.neo4j.kernel.internal.GraphDatabaseAPI;
import org.neo4j.procedure.Procedure;
import org.neo4j.procedure.UserAggregationFunction;
import org.neo4j.procedure.UserFunction;

/**
 * Embedded Neo4j (community) with Bolt, for integration tests.
 *
 * Usage: java -cp 'lib/*:classes' MemstreamNeo4j <home-dir> <neo4j.conf>
 *
 * The conf file uses normal neo4j.conf keys (server.bolt.listen_address, dbms.security.auth_enabled,
 * dbms.security.procedures.unrestricted, ...). Embedded Neo4j does not load procedures from the
 * classpath, so after start every class under org/neo4j/gds/ that has an @Procedure,
 * @UserFunction or @UserAggregationFunction method is registered through GlobalProcedures.
 * The GDS ExtensionFactory classes are found on the classpath by Neo4j itself (ServiceLoader).
 * With dbms.security.auth_enabled=true, the password of user "neo4j" is set from the environment
 * variable NEO4J_PASSWORD (never from the command line or a file), through the system database.
 * Prints "MEMSTREAM_NEO4J_READY" when done; shuts down cleanly on SIGTERM.
 */
public final class MemstreamNeo4j {
    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: MemstreamNeo4j <home-dir> <neo4j.conf>");
            System.exit(2);
        }
        long t0 = System.nanoTime();
        Path home = Path.of(args[0]).toAbsolutePath();
        Files.createDirectories(home);
        DatabaseManagementService dbms = new DatabaseManagementServiceBuilder(home)
                .loadPropertiesFromFile(Path.of(args[1]).toAbsolutePath())
                .build();
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            System.out.println("MemstreamNeo4j: shutting down");
            try {
                dbms.shutdown();
            } finally {
                stopped.countDown();
            }
        }, "memstream-neo4j-shutdown"));

        String password = System.getenv("NEO4J_PASSWORD");
        if (password != null && !password.isEmpty()) {
            try {
                dbms.database("system").executeTransactionally(
                        "ALTER USER neo4j SET PASSWORD $password CHANGE NOT REQUIRED", Map.of("password", password));
                System.out.println("MemstreamNeo4j: auth on, password of user neo4j set from NEO4J_PASSWORD");
            } catch (RuntimeException e) {
                // A restart on the same data with the same password: Neo4j refuses to "change" it.
                if (!String.valueOf(e.getMessage()).contains("cannot be the same")) {
                    throw e;
                }
                System.out.println("MemstreamNeo4j: auth on, the password of user neo4j is already NEO4J_PASSWORD's");
            }
        }
        GraphDatabaseService db = dbms.database("neo4j");
        GlobalProcedures procs = ((GraphDatabaseAPI) db).getDependencyResolver()
                .resolveDependency(GlobalProcedures.class);
        double tDb = (System.nanoTime() - t0) / 1e9;
        System.out.printf("MemstreamNeo4j: database and bolt up after %.1fs; registering GDS procedures "
                + "matching '%s'%n", tDb, FILTER.pattern());
        System.out.flush();
        int[] counts = registerGds(procs);
        System.out.printf("MemstreamNeo4j: registered %d procedure classes, %d function classes, "
                + "%d aggregation classes (%d classes failed)%n", counts[0], counts[1], counts[2], counts[3]);
        System.out.printf("MEMSTREAM_NEO4J_READY in %.1fs (database + bolt up after %.1fs)%n",
                (System.nanoTime() - t0) / 1e9, tDb);
        System.out.flush();
        stopped.await();
    }

    private static final byte[] PROC = "Lorg/neo4j/procedure/Procedure;".getBytes();
    private static final byte[] FUNC = "Lorg/neo4j/procedure/UserFunction;".getBytes();
    private static final byte[] AGG = "Lorg/neo4j/procedure/UserAggregationFunction;".getBytes();

    private static boolean contains(byte[] hay, byte[] needle) {
        outer:
        for (int i = 0; i <= hay.length - needle.length; i++) {
            for (int j = 0; j < needle.length; j++) {
                if (hay[i + j] != needle[j]) {
                    continue outer;
                }
            }
            return true;
        }
        return false;
    }

    /** -Dmemstream.gds.procedures=<regex> registers only classes having a matching procedure or
     *  function name (registration of all ~460 GDS procedures costs several seconds). */
    private static final java.util.regex.Pattern FILTER =
            java.util.regex.Pattern.compile(System.getProperty("memstream.gds.procedures", ".*"));

    private static boolean wanted(String name) {
        return FILTER.matcher(name).matches();
    }

    private static int[] registerGds(GlobalProcedures procs) throws IOException {
        int[] counts = new int[4];
        ClassLoader cl = MemstreamNeo4j.class.getClassLoader();
        for (String entry : System.getProperty("java.class.path").split(java.io.File.pathSeparator)) {
            if (!entry.endsWith(".jar")) {
                continue;
            }
            List<String> names = new ArrayList<>();
            try (JarFile jar = new JarFile(entry)) {
                Enumeration<JarEntry> e = jar.entries();
                while (e.hasMoreElements()) {
                    JarEntry je = e.nextElement();
                    String n = je.getName();
                    if (!n.startsWith("org/neo4j/gds/") || !n.endsWith(".class")) {
                        continue;
                    }
                    // cheap pre-filter: only classes whose constant pool names a procedure annotation
                    byte[] bytes;
                    try (var in = jar.getInputStream(je)) {
                        bytes = in.readAllBytes();
                    }
                    if (contains(bytes, PROC) || contains(bytes, FUNC) || contains(bytes, AGG)) {
                        names.add(n.substring(0, n.length() - 6).replace('/', '.'));
                    }
                }
            }
            for (String name : names) {
                boolean proc = false, func = false, agg = false;
                Class<?> c;
                try {
                    c = Class.forName(name, false, cl);
                    for (Method m : c.getDeclaredMethods()) {
                        Procedure p = m.getAnnotation(Procedure.class);
                        UserFunction f = m.getAnnotation(UserFunction.class);
                        UserAggregationFunction a = m.getAnnotation(UserAggregationFunction.class);
                        proc |= p != null && wanted(p.name().isEmpty() ? p.value() : p.name());
                        func |= f != null && wanted(f.name().isEmpty() ? f.value() : f.name());
                        agg |= a != null && wanted(a.name().isEmpty() ? a.value() : a.name());
                    }
                } catch (Throwable t) {
                    continue; // class with optional deps missing; cannot hold GDS procedures we use
                }
                try {
                    if (proc) { procs.registerProcedure(c); counts[0]++; }
                    if (func) { procs.registerFunction(c); counts[1]++; }
                    if (agg) { procs.registerAggregationFunction(c); counts[2]++; }
                } catch (Throwable t) {
                    counts[3]++;
                    System.out.println("MemstreamNeo4j: could not register " + name + ": " + t);
                }
            }
        }
        return counts;
    }
}
