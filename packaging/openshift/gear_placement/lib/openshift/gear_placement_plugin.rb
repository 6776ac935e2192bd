#
# gearshift's gear-placement plugin for the OpenShift v2 broker.
#
# Installed in place of the stock lib/openshift/gear_placement_plugin.rb of the
# rubygem-openshift-origin-gear-placement gem (see docs/openshift.md). The
# broker calls select_best_fit_node_impl with the nodes it already filtered
# (profile, region, full, deactivated, ...); this plugin hands them to
# gearshift's placement service by running
#
#   gearshift-broker place --input - --json
#
# with a placement.request body on standard input (docs/protocol.md, 7.6), and
# returns the server_infos entry named by the reply's "node".
#
# When gearshift does not give a usable answer (the command cannot start, does
# not finish within the timeout, exits non-zero -- a refusal exits 2 --, prints
# something that is not a JSON reply, or names a node that is not a candidate)
# the plugin logs why and falls back to OpenShift's default choice:
# OpenShift::MCollectiveApplicationContainerProxy.select_best_fit_node_impl
# (plugins/msg-broker/mcollective/lib/openshift/mcollective_application_container_proxy.rb,
# origin-server 7fd1910, lines 3497-3560). That default prefers districted
# nodes, then nodes with a zone; with more than four candidates it keeps those
# at or below the average consumed capacity (plus a little) and the districts
# with most free UIDs; then it picks at random, weighted toward the least
# consumed node (3:1 between the least and the most consumed). Without that
# class (outside a broker) the least consumed candidate is taken.
#
# Written for the Ruby the gem runs on (ruby193 SCL on EL6, Ruby 2.0 on EL7:
# rubygem-openshift-origin-gear-placement.spec): no keyword arguments,
# exception-less nonblocking IO or Integer#clamp.
#
# Nothing gearshift does makes the plugin raise: the broker does not catch a
# plugin's exception (controller/lib/openshift/application_container_proxy.rb:58-88),
# so an error here would fail the user's gear creation instead of falling back.
# Only the default choice itself may raise, as it does without the plugin
# (NodeUnavailableException when there is no candidate).
#
require 'json'
require 'logger'
require 'shellwords'
require 'time'

module OpenShift
  class GearPlacementPlugin
    # Settings and their defaults; the broker's initializer fills them from
    # /etc/openshift/plugins.d/openshift-origin-gear-placement.conf.
    DEFAULTS = {
      # The gearshift-broker executable (no shell is involved).
      :gearshift_command => '/usr/bin/gearshift-broker',
      # Its arguments: a String split like a shell would (quotes honoured,
      # nothing expanded) or an Array.
      :gearshift_args => 'place --input - --json --timeout 4s --from paas-broker',
      # Seconds to wait for the answer before killing the command and falling back.
      :gearshift_timeout => 5.0,
      # A placement strategy to request instead of the service's configured one.
      :gearshift_strategy => nil,
      # Extra environment for the command (GEARSHIFT_BUS, GEARSHIFT_OPERATOR_KEY, ...).
      :gearshift_env => {},
      # Log each request body at debug level.
      :gearshift_log_requests => false,
      # Largest answer read, in bytes.
      :gearshift_max_output => 1024 * 1024,
    }.freeze

    # Why gearshift's answer is not used (the message is logged).
    class Fallback < StandardError; end

    class << self
      # Settings merged over the broker's (tests set this).
      attr_accessor :settings_override
      attr_writer :logger

      # The broker's entry point (seed 003's signature). Returns one entry of
      # server_infos: gearshift's choice, or OpenShift's default choice.
      def select_best_fit_node_impl(server_infos, app_props, current_gears, comp_list, user_props, request_time)
        started = monotonic
        begin
          body = build_request(server_infos, app_props, current_gears, comp_list, user_props, request_time)
          node, reply = ask_gearshift(server_infos, body)
          logger.info("gearshift placement: #{node.name} (strategy #{reply['strategy']}, " \
                      "#{reply['candidates']} candidates of #{server_infos.length}) in #{elapsed_ms(started)} ms")
          return node
        rescue Fallback => e
          reason = e.message
        rescue StandardError => e
          reason = "#{e.class}: #{e.message}"
        end
        logger.warn("gearshift placement: #{reason} (after #{elapsed_ms(started)} ms); " \
                    "falling back to OpenShift's default choice")
        default_choice(server_infos)
      end

      # The settings in force: DEFAULTS, the broker's config.gear_placement, the override.
      def settings
        s = DEFAULTS.dup
        broker = broker_settings
        s.merge!(broker.select { |k, _| DEFAULTS.key?(k) }) if broker.is_a?(Hash)
        s.merge!(settings_override) if settings_override
        s
      end

      def logger
        @logger ||= if defined?(Rails) && Rails.respond_to?(:logger) && Rails.logger
                      Rails.logger
                    else
                      Logger.new($stderr)
                    end
      end

      # The placement.request body (proto/src/msg/placement.rs) as JSON text.
      def build_request(server_infos, app_props, current_gears, comp_list, user_props, request_time)
        req = {
          'nodes' => Array(server_infos).map { |s| node_json(s) },
          'app' => app_json(app_props),
          'current_gears' => Array(current_gears).compact.map { |g| gear_json(g) }.compact,
          'components' => Array(comp_list).compact.map { |c| component_json(c) },
          'user' => user_json(user_props),
          'request_time' => time_json(request_time),
        }
        strategy = settings[:gearshift_strategy]
        req['strategy'] = strategy.to_s if strategy && !strategy.to_s.empty?
        JSON.generate(req)
      end

      # OpenShift's own choice among server_infos.
      def default_choice(server_infos)
        if defined?(OpenShift::MCollectiveApplicationContainerProxy) &&
           OpenShift::MCollectiveApplicationContainerProxy.respond_to?(:select_best_fit_node_impl)
          # It sorts and deletes in place: give it a copy, its pick is still one of ours.
          OpenShift::MCollectiveApplicationContainerProxy.select_best_fit_node_impl(Array(server_infos).dup)
        else
          Array(server_infos).min_by { |s| s.node_consumed_capacity.to_f }
        end
      end

      private

      def broker_settings
        return nil unless defined?(Broker::Application)
        Broker::Application.config.gear_placement
      rescue NoMethodError
        nil
      end

      def ask_gearshift(server_infos, body)
        raise Fallback, 'no candidate nodes to send' if server_infos.nil? || server_infos.empty?
        s = settings
        logger.debug("gearshift placement request: #{body}") if s[:gearshift_log_requests]
        out, err, status = run_command(argv(s), body, s[:gearshift_timeout].to_f, s)
        reply = parse_reply(out)
        unless status.success?
          why = reply && reply['refused'] ? "refused: #{reply['refused']}" : last_line(err)
          raise Fallback, "#{s[:gearshift_command]} exited with #{status.exitstatus || status}: #{why}"
        end
        raise Fallback, "reply is not a JSON object: #{out[0, 200].inspect}" unless reply
        name = reply['node']
        unless name.is_a?(String) && !name.empty?
          raise Fallback, "reply names no node#{reply['refused'] ? " (refused: #{reply['refused']})" : ''}"
        end
        node = server_infos.find { |x| x.name == name }
        raise Fallback, "reply names #{name.inspect}, which is not among the candidates" unless node
        [node, reply]
      end

      def argv(s)
        cmd = s[:gearshift_command].to_s
        raise Fallback, 'no gearshift_command configured' if cmd.empty?
        args = s[:gearshift_args]
        args = args.is_a?(Array) ? args.map(&:to_s) : Shellwords.split(args.to_s)
        [cmd] + args
      end

      def parse_reply(out)
        v = JSON.parse(out)
        v.is_a?(Hash) ? v : nil
      rescue JSON::ParserError
        nil
      end

      def last_line(text)
        line = text.to_s.strip.split("\n").last
        line ? line[0, 300] : 'no message'
      end

      # Runs argv without a shell, feeds input, collects both outputs until
      # the command exits or the deadline passes (then kills its process group).
      def run_command(argv, input, timeout, s)
        in_r, in_w = IO.pipe
        out_r, out_w = IO.pipe
        err_r, err_w = IO.pipe
        env = (s[:gearshift_env] || {}).each_with_object({}) { |(k, v), h| h[k.to_s] = v.nil? ? nil : v.to_s }
        begin
          pid = Process.spawn(env, [argv[0], argv[0]], *argv[1..-1],
                              :in => in_r, :out => out_w, :err => err_w, :pgroup => true)
        rescue SystemCallError => e
          [in_r, in_w, out_r, out_w, err_r, err_w].each { |io| io.close unless io.closed? }
          raise Fallback, "cannot run #{argv[0]}: #{e.message}"
        end
        [in_r, out_w, err_w].each(&:close)
        deadline = monotonic + timeout
        begin
          out, err = pump(in_w, out_r, err_r, binary(input), deadline, s[:gearshift_max_output].to_i, timeout)
          status = reap(pid, deadline, timeout)
          pid = nil
          [out, err, status]
        ensure
          [in_w, out_r, err_r].each { |io| io.close unless io.closed? }
          kill(pid) if pid
        end
      end

      def pump(in_w, out_r, err_r, pending, deadline, max, timeout)
        out = binary('')
        err = binary('')
        readers = [out_r, err_r]
        writers = [in_w]
        until readers.empty?
          left = deadline - monotonic
          raise Fallback, "no answer within #{timeout} s (command killed)" if left <= 0
          ready = IO.select(readers, writers, nil, left)
          next unless ready
          ready[1].each do |w|
            begin
              n = w.write_nonblock(pending)
              pending = pending.byteslice(n, pending.bytesize - n)
            rescue IO::WaitWritable, Errno::EINTR
              next
            rescue Errno::EPIPE
              pending = ''
            end
            if pending.empty?
              w.close
              writers.clear
            end
          end
          ready[0].each do |r|
            begin
              chunk = r.read_nonblock(65_536)
            rescue IO::WaitReadable, Errno::EINTR
              next
            rescue EOFError
              readers.delete(r)
              next
            end
            buf = r.equal?(out_r) ? out : err
            buf << chunk
            raise Fallback, "answer larger than #{max} bytes" if buf.bytesize > max
          end
        end
        [out.force_encoding('UTF-8'), err.force_encoding('UTF-8')]
      end

      def reap(pid, deadline, timeout)
        loop do
          _, status = Process.waitpid2(pid, Process::WNOHANG)
          return status if status
          raise Fallback, "no exit within #{timeout} s (command killed)" if monotonic >= deadline
          sleep 0.01
        end
      end

      def kill(pid)
        Process.kill('KILL', -pid)
      rescue Errno::ESRCH, Errno::EPERM
        nil
      ensure
        begin
          Process.waitpid(pid)
        rescue Errno::ECHILD
          nil
        end
      end

      def node_json(s)
        cap = s.node_consumed_capacity.to_f
        h = { 'name' => s.name.to_s, 'node_consumed_capacity' => cap.finite? ? cap : 100.0, 'active' => true }
        h['district_id'] = s.district_id.to_s if present?(s.district_id)
        h['district_available_capacity'] = u32(s.district_available_capacity) unless s.district_available_capacity.nil?
        h['region_id'] = s.region_id.to_s if present?(s.region_id)
        h['zone_id'] = s.zone_id.to_s if present?(s.zone_id)
        h
      end

      def app_json(a)
        return { 'id' => '', 'name' => '' } if a.nil?
        h = { 'id' => a.id.to_s, 'name' => a.name.to_s }
        h['web_cartridge'] = a.web_cartridge.to_s if present?(a.web_cartridge)
        h['scalable'] = a.scalable ? true : false if a.respond_to?(:scalable)
        h['ha'] = a.ha ? true : false if a.respond_to?(:ha)
        h
      end

      def gear_json(g)
        return nil unless present?(g.server)
        h = { 'id' => g.id.to_s, 'name' => g.name.to_s, 'server' => g.server.to_s,
              'cartridges' => Array(g.cartridges).map(&:to_s) }
        h['district'] = g.district.to_s if present?(g.district)
        h['region'] = g.region.to_s if present?(g.region)
        h['zone'] = g.zone.to_s if present?(g.zone)
        h
      end

      def component_json(c)
        { 'cartridge_name' => c.cartridge_name.to_s, 'component_name' => c.component_name.to_s,
          'version' => c.version.to_s, 'cartridge_vendor' => c.cartridge_vendor.to_s }
      end

      def user_json(u)
        return { 'id' => '', 'login' => '' } if u.nil?
        h = { 'id' => u.id.to_s, 'login' => u.login.to_s,
              'consumed_gears' => u32(u.consumed_gears),
              'capabilities' => plain_hash(u.capabilities) }
        h['plan_id'] = u.plan_id.to_s if present?(u.plan_id)
        h['plan_state'] = u.plan_state.to_s if present?(u.plan_state)
        h
      end

      # Capabilities may hold BSON or other types: keep what survives JSON.
      def plain_hash(v)
        return {} unless v.is_a?(Hash)
        JSON.parse(JSON.generate(v))
      rescue StandardError
        {}
      end

      def time_json(t)
        t = Time.now unless t.respond_to?(:getutc)
        t.getutc.iso8601(3)
      end

      def present?(v)
        !(v.nil? || (v.respond_to?(:empty?) && v.empty?))
      end

      def u32(v)
        [[v.to_i, 0].max, 4_294_967_295].min
      end

      def binary(s)
        s.dup.force_encoding('BINARY')
      end

      def monotonic
        if defined?(Process::CLOCK_MONOTONIC)
          Process.clock_gettime(Process::CLOCK_MONOTONIC)
        else
          Time.now.to_f
        end
      end

      def elapsed_ms(started)
        ((monotonic - started) * 1000).round
      end
    end
  end
end
