CREATE OR REPLACE FUNCTION streamledger_claim(
  p_pipeline varchar, p_broker varchar, p_stream varchar, p_super_stream varchar,
  p_end_limit bigint, p_dag_id varchar, p_run_id varchar, p_task_id varchar, p_map_index integer,
  p_try_number integer, p_initial bigint, p_now timestamp, p_max_span bigint,
  p_abandon_before timestamp, p_span_start bigint, p_span_end bigint, p_interval_start timestamp,
  p_interval_end timestamp)
RETURNS SETOF streamledger_range LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  sid bigint;
  pid bigint;
  held streamledger_range;
  made streamledger_range;
  hole_start bigint;
  hole_end bigint;
  tail bigint;
  s bigint;
  e bigint;
BEGIN
  SELECT src.id INTO sid FROM streamledger_source src
    JOIN streamledger_pipeline p ON p.id = src.pipeline_id
   WHERE p.name = p_pipeline AND src.broker = p_broker AND src.stream = p_stream
   FOR UPDATE OF src;
  IF sid IS NULL THEN
    INSERT INTO streamledger_pipeline (name, created_at) VALUES (p_pipeline, p_now)
      ON CONFLICT (name) DO NOTHING;
    SELECT id INTO pid FROM streamledger_pipeline WHERE name = p_pipeline;
    INSERT INTO streamledger_source (pipeline_id, broker, stream, super_stream, created_at)
      VALUES (pid, p_broker, p_stream, p_super_stream, p_now)
      ON CONFLICT (pipeline_id, broker, stream) DO NOTHING;
    SELECT src.id INTO sid FROM streamledger_source src
     WHERE src.pipeline_id = pid AND src.broker = p_broker AND src.stream = p_stream
     FOR UPDATE;
  END IF;

  SELECT * INTO held FROM streamledger_range r
   WHERE r.source_id = sid AND r.dag_id = p_dag_id AND r.run_id = p_run_id AND r.task_id = p_task_id
     AND r.map_index = p_map_index AND r.status IN ('claimed', 'committed');
  IF FOUND THEN
    IF held.status = 'claimed' THEN
      UPDATE streamledger_range SET try_number = p_try_number, heartbeat_at = p_now, updated_at = p_now
       WHERE id = held.id RETURNING * INTO held;
    END IF;
    RETURN NEXT held;
    RETURN;
  END IF;

  IF p_abandon_before IS NOT NULL THEN
    UPDATE streamledger_range r
       SET status = 'failed', updated_at = p_now,
           error = 'abandoned: no heartbeat since ' || COALESCE(r.heartbeat_at, r.claimed_at)::text
     WHERE r.source_id = sid AND r.status = 'claimed'
       AND COALESCE(r.heartbeat_at, r.claimed_at) < p_abandon_before;
  END IF;

  IF p_span_start IS NOT NULL THEN
    IF p_span_end > p_span_start THEN
      SELECT * INTO held FROM streamledger_range r
       WHERE r.source_id = sid AND r.status <> 'failed'
         AND r.start_offset = p_span_start AND r.end_offset = p_span_end;
      IF FOUND THEN
        RETURN NEXT held;  -- done by another run: an idempotent rerun (a live claim: the caller refuses)
        RETURN;
      END IF;
    END IF;
    IF p_initial IS NOT NULL AND p_initial < p_span_start
       AND NOT EXISTS (SELECT 1 FROM streamledger_range r WHERE r.source_id = sid) THEN
      INSERT INTO streamledger_range (source_id, start_offset, end_offset, status, dag_id, run_id, task_id,
          map_index, try_number, records, offset_stored, offset_verified, error, claimed_at, committed_at,
          updated_at)
        VALUES (sid, p_initial, p_initial, 'committed', 'streamledger', 'origin', 'ledger', -1, 1, 0, false,
          false, 'origin of pinned ranges', p_now, p_now, p_now);
    END IF;
    s := p_span_start;
    e := p_span_end;
  ELSE
    SELECT x.redo_at, x.redo_end INTO hole_start, hole_end FROM (
SELECT r.source_id, r.redo_at,
       COALESCE((SELECT MIN(l.start_offset) FROM streamledger_range l
                 WHERE l.source_id = r.source_id AND l.status <> 'failed' AND l.end_offset > l.start_offset
                   AND l.start_offset > r.redo_at AND l.start_offset < r.failed_end),
                r.failed_end) AS redo_end
FROM (
  SELECT p.source_id, p.redo_at, p.failed_end,
         ROW_NUMBER() OVER (PARTITION BY p.source_id ORDER BY p.redo_at, p.failed_end) AS pick
  FROM (
SELECT c.source_id, c.failed_id, c.redo_at, c.failed_end FROM (
  SELECT f.source_id, f.id AS failed_id, f.start_offset AS redo_at, f.end_offset AS failed_end
  FROM streamledger_range f
  WHERE f.source_id = sid AND f.status = 'failed' AND f.end_offset > f.start_offset
  UNION ALL
  SELECT f.source_id, f.id, l.end_offset, f.end_offset
  FROM streamledger_range f JOIN streamledger_range l
    ON l.source_id = f.source_id AND l.status <> 'failed' AND l.end_offset > l.start_offset
   AND l.end_offset > f.start_offset AND l.end_offset < f.end_offset
  WHERE f.source_id = sid AND f.status = 'failed' AND f.end_offset > f.start_offset
) c
WHERE COALESCE((SELECT l.end_offset FROM streamledger_range l
                WHERE l.source_id = c.source_id AND l.status <> 'failed' AND l.end_offset > l.start_offset
                  AND l.start_offset <= c.redo_at
                ORDER BY l.start_offset DESC LIMIT 1), -1) <= c.redo_at
  ) p
) r
WHERE r.pick = 1
    ) x;
    IF hole_start IS NOT NULL THEN
      s := hole_start;
      e := hole_end;
    ELSE
      SELECT r.end_offset INTO tail FROM streamledger_range r
       WHERE r.source_id = sid AND r.status <> 'failed'
       ORDER BY r.start_offset DESC, r.end_offset DESC LIMIT 1;
      s := COALESCE(tail, p_initial);
      IF s IS NULL THEN
        RETURN;
      END IF;
      e := GREATEST(s, p_end_limit);
      IF p_max_span IS NOT NULL THEN
        e := LEAST(e, s + p_max_span);
      END IF;
    END IF;
  END IF;

  INSERT INTO streamledger_range (source_id, start_offset, end_offset, status, dag_id, run_id, task_id,
      map_index, try_number, records, first_seen, last_seen, output, offset_stored, offset_verified,
      error, claimed_at, committed_at, updated_at, heartbeat_at, pinned, interval_start, interval_end)
    VALUES (sid, s, e, CASE WHEN s = e THEN 'committed' ELSE 'claimed' END, p_dag_id, p_run_id,
      p_task_id, p_map_index, p_try_number, CASE WHEN s = e THEN 0 END, NULL, NULL, NULL, false, false,
      NULL, p_now, CASE WHEN s = e THEN p_now END, p_now, p_now, p_span_start IS NOT NULL,
      p_interval_start, p_interval_end)
    RETURNING * INTO made;
  RETURN NEXT made;
END;
$$
