// CuratorPeer holds, tries and waits on Apache Curator locks, driven by
// zklock's interop tests over stdin/stdout. One line per command:
//
//	mutex ID PATH        make lock ID an InterProcessMutex on PATH
//	read ID PATH         make lock ID the read side of an InterProcessReadWriteLock on PATH
//	write ID PATH        make lock ID the write side of an InterProcessReadWriteLock on PATH
//	sem ID PATH N        make lock ID a permit of an InterProcessSemaphoreV2 on PATH with N leases
//	try ID               acquire with no wait: prints "ID got" or "ID busy"
//	lock ID              acquire, waiting: prints "ID waiting", then "ID locked"
//	release ID           prints "ID released"
//	exit                 close the client and exit
//
// Curator's mutexes belong to the thread that acquired them, so every lock
// runs its commands on a thread of its own. Usage:
//
//	java CuratorPeer CONNECT_STRING SESSION_TIMEOUT_MS
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessLock;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryNTimes;

public class CuratorPeer {
    interface Lock {
        boolean acquire(long ms) throws Exception; // ms < 0: wait

        void release() throws Exception;
    }

    static Lock of(InterProcessLock l) {
        return new Lock() {
            public boolean acquire(long ms) throws Exception {
                if (ms < 0) {
                    l.acquire();
                    return true;
                }
                return l.acquire(ms, TimeUnit.MILLISECONDS);
            }

            public void release() throws Exception {
                l.release();
            }
        };
    }

    static Lock of(InterProcessSemaphoreV2 s) {
        return new Lock() {
            Lease lease;

            public boolean acquire(long ms) throws Exception {
                lease = ms < 0 ? s.acquire() : s.acquire(ms, TimeUnit.MILLISECONDS);
                return lease != null;
            }

            public void release() throws Exception {
                s.returnLease(lease);
                lease = null;
            }
        };
    }

    static synchronized void say(String s) {
        System.out.println(s);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(args[0])
                .sessionTimeoutMs(Integer.parseInt(args[1]))
                .connectionTimeoutMs(15000)
                .retryPolicy(new RetryNTimes(50, 100))
                .build();
        client.start();
        if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
            say("error not connected");
            System.exit(1);
        }
        Map<String, Lock> locks = new HashMap<>();
        Map<String, ExecutorService> threads = new HashMap<>();
        say("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line; (line = in.readLine()) != null;) {
            String[] f = line.trim().split(" ");
            String cmd = f[0];
            if (cmd.equals("exit")) {
                break;
            }
            String id = f[1];
            switch (cmd) {
                case "mutex":
                    locks.put(id, of(new InterProcessMutex(client, f[2])));
                    break;
                case "read":
                    locks.put(id, of(new InterProcessReadWriteLock(client, f[2]).readLock()));
                    break;
                case "write":
                    locks.put(id, of(new InterProcessReadWriteLock(client, f[2]).writeLock()));
                    break;
                case "sem":
                    locks.put(id, of(new InterProcessSemaphoreV2(client, f[2], Integer.parseInt(f[3]))));
                    break;
                default:
                    Lock l = locks.get(id);
                    ExecutorService ex = threads.computeIfAbsent(id, k -> Executors.newSingleThreadExecutor());
                    ex.submit(() -> {
                        try {
                            switch (cmd) {
                                case "try":
                                    say(id + (l.acquire(0) ? " got" : " busy"));
                                    break;
                                case "lock":
                                    say(id + " waiting");
                                    l.acquire(-1);
                                    say(id + " locked");
                                    break;
                                case "release":
                                    l.release();
                                    say(id + " released");
                                    break;
                                default:
                                    say("error unknown command " + cmd);
                            }
                        } catch (Exception e) {
                            say("error " + id + " " + e);
                        }
                    });
            }
        }
        for (ExecutorService ex : threads.values()) {
            ex.shutdown();
        }
        client.close();
        System.exit(0);
    }
}
