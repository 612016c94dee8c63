-- Typed orders from one range of raw JSON order events. streamledger runs this once per ledger range,
-- on exactly that range's records (the view `records`: the stream's columns plus the decoded body's
-- fields, STREAMLEDGER_BODY_SCHEMA); malformed bodies went to the range's dead letter before it.
-- Airflow renders this file as a Jinja template (the operator's `sql_file`), like its SQL operators.
SELECT order_id,
       customer,
       amount,
       currency,
       CAST(amount * CASE currency WHEN 'EUR' THEN 1.08 WHEN 'GBP' THEN 1.27 ELSE 1.00 END AS DECIMAL(14, 2))
           AS amount_usd,
       ordered_at,
       stream AS partition,
       offset AS source_offset
FROM records
WHERE status <> 'cancelled'
